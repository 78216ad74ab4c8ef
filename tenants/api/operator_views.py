"""Management API, operator side: tenants and tiers (users with the operator role only, tenants/roles.py)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers as drf
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.pagination import Pages
from tenants import selectors, services
from tenants.models import Tier

from . import serializers as s
from .permissions import IsOperator

CreatedTenant = inline_serializer(
    "CreatedTenant", {"tenant": s.TenantSerializer(), "api_key": drf.CharField(help_text="Shown once.")}
)


class OperatorView(APIView):
    permission_classes = [IsOperator]


class TenantListView(OperatorView):
    pagination_class = Pages  # for the schema (drf-spectacular): its GET answers a page

    @extend_schema(responses=s.TenantSerializer(many=True), summary="List tenants")
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.tenant_list(), request, view=self)
        return paginator.get_paginated_response(s.TenantSerializer(page, many=True).data)

    @extend_schema(request=s.TenantSerializer, responses={201: CreatedTenant}, summary="Create a tenant and its first key")
    def post(self, request: Request) -> Response:
        body = s.TenantSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        tenant, created = services.tenant_create_with_key(
            name=data.pop("name"), tier=data.pop("tier"), slug=data.pop("slug", None)
        )
        if data:
            tenant = services.tenant_update(tenant=tenant, **data)
        return Response(
            {"tenant": s.TenantSerializer(tenant).data, "api_key": created.secret}, status=status.HTTP_201_CREATED
        )


class TenantDetailView(OperatorView):
    @extend_schema(responses=s.TenantDetailSerializer, summary="Show a tenant with its effective limits")
    def get(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        data = s.TenantSerializer(tenant).data
        data["limits"] = s.LimitsSerializer(selectors.tenant_limits(tenant=tenant)).data
        return Response(data)

    @extend_schema(request=s.TenantUpdateSerializer, responses=s.TenantSerializer, summary="Change a tenant's name, tier or overrides")
    def patch(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        body = s.TenantUpdateSerializer(tenant, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        tenant = services.tenant_update(tenant=tenant, **body.validated_data)
        return Response(s.TenantSerializer(tenant).data)


class TenantSuspendView(OperatorView):
    @extend_schema(request=None, responses=s.TenantSerializer, summary="Suspend a tenant (its keys are refused)")
    def post(self, request: Request, slug: str) -> Response:
        return Response(s.TenantSerializer(services.tenant_suspend(tenant=selectors.tenant_get(slug=slug))).data)


class TenantActivateView(OperatorView):
    @extend_schema(request=None, responses=s.TenantSerializer, summary="Re-activate a suspended tenant")
    def post(self, request: Request, slug: str) -> Response:
        return Response(s.TenantSerializer(services.tenant_activate(tenant=selectors.tenant_get(slug=slug))).data)


class TierListView(OperatorView):
    @extend_schema(responses=s.TierSerializer(many=True), summary="List tiers")
    def get(self, request: Request) -> Response:
        return Response(s.TierSerializer(Tier.objects.all(), many=True).data)

    @extend_schema(request=s.TierSerializer, responses={201: s.TierSerializer}, summary="Create a tier")
    def post(self, request: Request) -> Response:
        body = s.TierSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(s.TierSerializer(services.tier_create(**body.validated_data)).data, status=status.HTTP_201_CREATED)


class TierDetailView(OperatorView):
    @extend_schema(responses=s.TierSerializer, summary="Show a tier")
    def get(self, request: Request, name: str) -> Response:
        return Response(s.TierSerializer(selectors.tier_get(name=name)).data)

    @extend_schema(request=s.TierUpdateSerializer, responses=s.TierSerializer, summary="Change a tier's limits")
    def patch(self, request: Request, name: str) -> Response:
        tier = selectors.tier_get(name=name)
        body = s.TierUpdateSerializer(tier, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        return Response(s.TierSerializer(services.tier_update(tier=tier, **body.validated_data)).data)
