"""Management API for the audit log: a tenant's managing key reads its own tenant's events;
operators and finance read any tenant's and export everything (CSV, JSON Lines)."""

from __future__ import annotations

from datetime import datetime

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, renderers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.instants import parse_instant
from common.pagination import Pages
from common.renderers import CSVRenderer, JSONLinesRenderer
from tenants.api.permissions import IsFinance, IsOperator
from tenants.api.views import TenantScopedView
from tenants.selectors import tenant_id_by_id_or_slug

from .. import exports, selectors
from . import serializers as s

FILTERS = [
    OpenApiParameter("action", OpenApiTypes.STR,
                     description='an action ("api_key.revoke") or its family ("api_key": every api_key.* action)'),
    OpenApiParameter("since", OpenApiTypes.STR, description="ISO date (midnight UTC) or datetime, inclusive"),
    OpenApiParameter("until", OpenApiTypes.STR, description="ISO date or datetime, exclusive"),
]


def instant(raw: str | None, name: str) -> datetime | None:
    if not raw:
        return None
    try:
        return parse_instant(raw)
    except ValueError:
        raise exceptions.ValidationError({name: f"not an ISO date or datetime: {raw[:40]!r}"}) from None


def _filters(request: Request) -> dict:
    params = request.query_params
    action = params.get("action") or None
    if action is not None and (len(action) > 64 or "\x00" in action):
        raise exceptions.ValidationError({"action": "at most 64 characters, no NUL"})
    since, until = instant(params.get("since"), "since"), instant(params.get("until"), "until")
    if since and until and until <= since:
        raise exceptions.ValidationError({"until": "must be after since"})
    return {"action": action, "since": since, "until": until}


PAGE = [OpenApiParameter("limit", OpenApiTypes.INT, description="events per page (default 100)"),
        OpenApiParameter("offset", OpenApiTypes.INT, description="events to skip")]


class AuditEventListView(TenantScopedView):
    """`/api/v1/audit-events/`: the key's own tenant; `/api/v1/tenants/<slug>/audit-events/`: operators, finance."""

    slug_permission_classes = (IsOperator | IsFinance,)

    def page(self, request: Request, serializer_class) -> Response:
        events = selectors.audit_events(tenant_id=self.tenant(request).pk, **_filters(request))
        paginator = Pages()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(serializer_class(page, many=True).data)

    @extend_schema(parameters=[*FILTERS, *PAGE], responses=s.TenantAuditEventPageSerializer,
                   summary="Audit events of your tenant (newest first): who changed what, when, from where")
    def get(self, request: Request, **kwargs) -> Response:
        return self.page(request, s.TenantAuditEventSerializer)


class TenantAuditEventListView(AuditEventListView):
    @extend_schema(parameters=[*FILTERS, *PAGE], responses=s.AuditEventPageSerializer,
                   summary="Audit events of a tenant, with the people who acted (operators and finance)")
    def get(self, request: Request, **kwargs) -> Response:
        return self.page(request, s.AuditEventSerializer)


class AuditExportView(APIView):
    """Every tenant's events and the platform's (users, tiers, prices, deployments), oldest first."""

    permission_classes = [IsFinance]  # finance, operators, superusers; never tenant keys
    renderer_classes = [renderers.JSONRenderer, CSVRenderer, JSONLinesRenderer]
    file_format = "csv"

    @extend_schema(
        parameters=[*FILTERS, OpenApiParameter("tenant", OpenApiTypes.STR, description="tenant id or slug")],
        responses={(200, "text/csv"): OpenApiTypes.BINARY, (200, "application/jsonl"): OpenApiTypes.BINARY},
        summary="Export audit events (finance and operators)",
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        filters = _filters(request)
        raw_tenant = request.query_params.get("tenant")
        tenant_id = None
        if raw_tenant:
            tenant_id = tenant_id_by_id_or_slug(raw_tenant)
            if tenant_id is None:
                raise exceptions.ValidationError({"tenant": f"no tenant {raw_tenant[:64]!r}"})
        events = selectors.audit_events(tenant_id=tenant_id, all_tenants=True, **filters)
        content_type = "text/csv; charset=utf-8" if self.file_format == "csv" else "application/jsonl; charset=utf-8"
        response = StreamingHttpResponse(exports.stream(self.file_format, events), content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="audit-events.{self.file_format}"'
        response["Cache-Control"] = "no-store"
        return response
