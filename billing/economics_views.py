"""GET /api/v1/billing/unit-economics and its CSV / Parquet exports: parse, call the report, format.

Finance and operators only (IsFinance): tenants' keys and staff without a role are refused, since
the report shows every tenant's revenue and the platform's costs.
"""

from __future__ import annotations

from dataclasses import asdict
from decimal import Decimal

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, renderers
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import exports
from billing.costs.export import VIEWS, report_rows
from billing.costs.months import month_range
from billing.costs.report import PERIODS, unit_economics
from common.renderers import CSVRenderer, ParquetRenderer
from tenants.api.permissions import IsFinance

_PARAMETERS = [
    OpenApiParameter("month", OpenApiTypes.STR, required=True, description="YYYY-MM (UTC calendar month)"),
    OpenApiParameter("by", OpenApiTypes.STR, enum=list(PERIODS), description="lines per month (default) or day"),
]


def _query(request) -> tuple:
    try:
        start, end = month_range(request.query_params.get("month"))
    except ValueError as exc:
        raise exceptions.ValidationError({"month": str(exc)}) from None
    by = request.query_params.get("by") or "month"
    if by not in PERIODS:
        raise exceptions.ValidationError({"by": f"must be one of {', '.join(PERIODS)}"})
    return start, end, by


def _plain(value):
    """JSON: money and ratios as exact decimal strings, dates as ISO."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


class UnitEconomicsView(APIView):
    """GET ?month=YYYY-MM[&by=month|day]: revenue, cost and margin per tenant x model x tier; $/M tokens,
    utilisation and idle per deployment x worker class."""

    permission_classes = [IsFinance]

    @extend_schema(parameters=_PARAMETERS, responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        start, end, by = _query(request)
        report = unit_economics(start=start, end=end, period=by)
        body = _plain(asdict(report))
        body["month"] = f"{start:%Y-%m}"
        return Response(body, headers={"Cache-Control": "no-store"})


class UnitEconomicsExportView(APIView):
    """GET ?month=YYYY-MM[&by=]: one view of the report (tenants or deployments) as CSV or Parquet."""

    permission_classes = [IsFinance]
    renderer_classes = [renderers.JSONRenderer, CSVRenderer, ParquetRenderer]
    view = "tenants"
    file_format = "csv"

    @extend_schema(parameters=_PARAMETERS,
                   responses={(200, "text/csv"): OpenApiTypes.BINARY, (200, ParquetRenderer.media_type): OpenApiTypes.BINARY})
    def get(self, request):
        start, end, by = _query(request)
        report = unit_economics(start=start, end=end, period=by)
        columns = VIEWS[self.view]
        rows = report_rows(report, self.view)
        if self.file_format == "csv":
            response = StreamingHttpResponse(exports.csv_stream(columns, rows), content_type="text/csv; charset=utf-8")
        else:
            response = StreamingHttpResponse(exports.parquet_stream(columns, rows),
                                             content_type=ParquetRenderer.media_type)
        response["Content-Disposition"] = (
            f'attachment; filename="unit-economics-{self.view}-{start:%Y%m}-{by}.{self.file_format}"')
        response["Cache-Control"] = "no-store"
        return response
