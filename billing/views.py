"""Finance export endpoints (streamed CSV / Parquet). They parse the query, pick rows, stream."""

from __future__ import annotations

from datetime import UTC, date, datetime, time

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, renderers
from rest_framework.views import APIView

from billing import exports
from common.instants import parse_instant
from common.renderers import CSVRenderer, ParquetRenderer
from tenants.api.permissions import IsFinance
from tenants.selectors import tenant_id_by_id_or_slug


def _instant(raw: str | None, name: str) -> datetime:
    if not raw:
        raise exceptions.ValidationError({name: "required (ISO date or datetime)"})
    try:
        return parse_instant(raw)
    except ValueError:
        raise exceptions.ValidationError({name: f"not an ISO date or datetime: {raw[:40]!r}"}) from None


def _tenant_id(raw: str | None) -> int | None:
    if not raw:
        return None
    tenant_id = tenant_id_by_id_or_slug(raw)
    if tenant_id is None:
        raise exceptions.ValidationError({"tenant": f"no tenant {raw!r}"})
    return tenant_id


class _ExportView(APIView):
    permission_classes = [IsFinance]  # finance, operators, superusers; never tenant keys
    renderer_classes = [renderers.JSONRenderer, CSVRenderer, ParquetRenderer]
    columns: list = []
    file_format = "csv"
    name = ""

    def rows(self, *, start, end, tenant_id):
        raise NotImplementedError

    @extend_schema(
        parameters=[
            OpenApiParameter("from", OpenApiTypes.STR, required=True, description="ISO date (midnight UTC) or datetime"),
            OpenApiParameter("to", OpenApiTypes.STR, required=True, description="exclusive; ISO date or datetime"),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="tenant id or slug (default: all)"),
        ],
        responses={(200, "text/csv"): OpenApiTypes.BINARY, (200, ParquetRenderer.media_type): OpenApiTypes.BINARY},
    )
    def get(self, request):
        start, end = _instant(request.query_params.get("from"), "from"), _instant(request.query_params.get("to"), "to")
        if end <= start:
            raise exceptions.ValidationError({"to": "must be after from"})
        rows = self.rows(start=start, end=end, tenant_id=_tenant_id(request.query_params.get("tenant")))
        filename = f"{self.name}-{start:%Y%m%d}-{end:%Y%m%d}.{self.file_format}"
        if self.file_format == "csv":
            response = StreamingHttpResponse(exports.csv_stream(self.columns, rows), content_type="text/csv; charset=utf-8")
        else:
            response = StreamingHttpResponse(
                exports.parquet_stream(self.columns, rows), content_type=ParquetRenderer.media_type
            )
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        response["Cache-Control"] = "no-store"
        return response


class UsageExportView(_ExportView):
    """GET ?from=&to=[&tenant=]: one row per request that started in [from, to)."""

    columns, name = exports.USAGE_COLUMNS, "usage"

    def rows(self, *, start, end, tenant_id):
        return exports.usage_rows(start=start, end=end, tenant_id=tenant_id)


class InvoiceExportView(_ExportView):
    """GET ?from=&to=[&tenant=]: one row per line of the (non-void) invoices whose month starts in [from, to)."""

    columns, name = exports.INVOICE_COLUMNS, "invoices"

    def rows(self, *, start, end, tenant_id):
        return exports.invoice_rows(start=_first_day_at_or_after(start), end=_first_day_at_or_after(end), tenant_id=tenant_id)


def _first_day_at_or_after(instant: datetime) -> date:
    """Invoice periods start at midnight UTC: the first such day not before `instant`."""
    instant = instant.astimezone(UTC)
    return instant.date() if instant.time() == time.min else date.fromordinal(instant.date().toordinal() + 1)
