"""`GET /api/v1/slo/`: SLO status rows. Operators see every tenant (or one, `?tenant=slug`, or per tier
with `?group=tier`); a tenant's managing key sees only its own rows (`tenant` from the key)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import ApplicationError
from tenants import selectors as tenant_selectors
from tenants.api.authentication import TenantUser
from tenants.api.permissions import IsOperator, IsTenantKey
from tenants.models import Tenant

from .selectors import slo_status

GROUPS = {"tenant": ("tenant", "tier", "model"), "tier": ("tier",), "tier_model": ("tier", "model")}


class SLOStatusView(APIView):
    permission_classes = [IsOperator | IsTenantKey]

    @extend_schema(
        summary="SLO attainment, error budget and burn rates per tenant, tier and model",
        parameters=[
            OpenApiParameter("tenant", str, description="operators: one tenant's slug"),
            OpenApiParameter("group", str, enum=list(GROUPS), description="operators: rows per tenant (default), tier, or tier and model"),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request) -> Response:
        user = request.user
        tenant: Tenant | None = None
        group = GROUPS["tenant"]
        if isinstance(user, TenantUser):
            tenant = Tenant.objects.get(pk=user.principal.tenant_id)
        else:
            if slug := request.query_params.get("tenant"):
                tenant = tenant_selectors.tenant_get(slug=slug)
            name = request.query_params.get("group", "tenant")
            if name not in GROUPS:
                raise ApplicationError(f"group: must be one of {sorted(GROUPS)}", code="invalid_value")
            group = GROUPS[name]
        rows = slo_status(tenant=tenant, group_by=group)
        return Response({"results": [row.as_dict() for row in rows]})
