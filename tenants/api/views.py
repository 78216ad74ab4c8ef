"""Management API, tenant side and key operations. One view per operation.

Key views serve two URL shapes: `/api/v1/keys/...` for a tenant's own key (the tenant comes
from the key, never from the URL) and `/api/v1/tenants/<slug>/keys/...` for operators.
"""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import PermissionDenied
from tenants import selectors, services
from tenants.models import Tenant

from . import serializers as s
from .authentication import TenantUser
from .permissions import IsFinance, IsOperator, IsTenantKey


class TenantScopedView(APIView):
    """Resolves the tenant a request acts on, and who may act on it."""

    # Who may use the `/tenants/<slug>/...` shape; without a slug only the tenant's own key may.
    slug_permission_classes = (IsOperator,)

    def get_permissions(self):
        if "slug" in self.kwargs:
            return [permission() for permission in self.slug_permission_classes]
        return [IsTenantKey()]

    def acting_key(self, request: Request):
        """The managing key's principal when a tenant acts (its scopes bound what it may grant); None for operators."""
        user = request.user
        return user.principal if isinstance(user, TenantUser) else None

    def tenant(self, request: Request) -> Tenant:
        if "slug" in self.kwargs:
            return selectors.tenant_get(slug=self.kwargs["slug"])
        user = request.user
        if not isinstance(user, TenantUser):  # get_permissions makes this unreachable
            raise PermissionDenied()
        return Tenant.objects.select_related("tier").get(pk=user.principal.tenant_id)


def _created(created: services.CreatedKey) -> dict:
    data = s.APIKeySerializer(created.key).data
    data["api_key"] = created.secret
    return data


class MeView(TenantScopedView):
    @extend_schema(responses=s.TenantDetailSerializer, summary="Your tenant, tier and effective limits")
    def get(self, request: Request, **kwargs) -> Response:
        tenant = self.tenant(request)
        data = s.TenantSerializer(tenant).data
        data["limits"] = s.LimitsSerializer(selectors.tenant_limits(tenant=tenant)).data
        return Response(data)


class UsageView(TenantScopedView):
    slug_permission_classes = (IsOperator | IsFinance,)

    @extend_schema(responses=s.UsageSerializer, summary="This month's usage against the budgets")
    def get(self, request: Request, **kwargs) -> Response:
        return Response(s.UsageSerializer(selectors.tenant_usage(tenant=self.tenant(request))).data)


class KeyListView(TenantScopedView):
    @extend_schema(responses=s.APIKeySerializer(many=True), summary="List API keys")
    def get(self, request: Request, **kwargs) -> Response:
        keys = selectors.api_key_list(tenant=self.tenant(request)).select_related("tenant")
        return Response(s.APIKeySerializer(keys, many=True).data)

    @extend_schema(request=s.APIKeyCreateSerializer, responses={201: s.CreatedAPIKeySerializer}, summary="Create an API key (the secret is shown once)")
    def post(self, request: Request, **kwargs) -> Response:
        body = s.APIKeyCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        created = services.api_key_create(
            tenant=self.tenant(request), granted_by=self.acting_key(request), **body.validated_data
        )
        return Response(_created(created), status=status.HTTP_201_CREATED)


class KeyDetailView(TenantScopedView):
    @extend_schema(responses=s.APIKeySerializer, summary="Show an API key (never its secret)")
    def get(self, request: Request, key_id: int, **kwargs) -> Response:
        key = selectors.api_key_get(tenant=self.tenant(request), key_id=key_id)
        return Response(s.APIKeySerializer(key).data)

    @extend_schema(request=s.APIKeyUpdateSerializer, responses=s.APIKeySerializer, summary="Rename or re-scope an API key")
    def patch(self, request: Request, key_id: int, **kwargs) -> Response:
        tenant = self.tenant(request)
        key = selectors.api_key_get(tenant=tenant, key_id=key_id)
        body = s.APIKeyUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        key = services.api_key_update(
            tenant=tenant, key=key, granted_by=self.acting_key(request), **body.validated_data
        )
        return Response(s.APIKeySerializer(key).data)


class KeyRevokeView(TenantScopedView):
    @extend_schema(request=None, responses=s.APIKeySerializer, summary="Revoke an API key now")
    def post(self, request: Request, key_id: int, **kwargs) -> Response:
        tenant = self.tenant(request)
        key = selectors.api_key_get(tenant=tenant, key_id=key_id)
        return Response(s.APIKeySerializer(services.api_key_revoke(tenant=tenant, key=key)).data)


class KeyRotateView(TenantScopedView):
    @extend_schema(request=s.APIKeyRotateSerializer, responses={201: s.CreatedAPIKeySerializer}, summary="Rotate: a new key now, the old one expires after the grace period")
    def post(self, request: Request, key_id: int, **kwargs) -> Response:
        tenant = self.tenant(request)
        key = selectors.api_key_get(tenant=tenant, key_id=key_id)
        body = s.APIKeyRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        created = services.api_key_rotate(
            tenant=tenant,
            key=key,
            grace=timedelta(seconds=body.validated_data["grace_seconds"]),
            granted_by=self.acting_key(request),
        )
        return Response(_created(created), status=status.HTTP_201_CREATED)
