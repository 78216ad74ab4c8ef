"""`manage.py export_usage --month 2026-11 --format csv|parquet [--out FILE] [--tenant ID|SLUG]`."""

from __future__ import annotations

from datetime import UTC, datetime, time

from django.core.management.base import BaseCommand, CommandError

from billing import exports
from billing.management.export_out import write_export
from billing.services.invoices import month_bounds
from common.instants import parse_month
from tenants.selectors import tenant_id_by_id_or_slug


class Command(BaseCommand):
    help = "Export one month of usage, one row per request (CSV to standard output unless --out is given)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--month", required=True, help="YYYY-MM (UTC calendar month)")
        parser.add_argument("--format", choices=["csv", "parquet"], default="csv")
        parser.add_argument("--out", help="file to write (default: standard output)")
        parser.add_argument("--tenant", help="tenant id or slug (default: all tenants)")

    def handle(self, *args, month: str, format: str, out: str | None, tenant: str | None, **options) -> None:
        try:
            first = parse_month(month)
        except ValueError:
            raise CommandError(f"--month must be YYYY-MM, got {month!r}") from None
        period_start, period_end = month_bounds(first)
        tenant_id = None
        if tenant:
            tenant_id = tenant_id_by_id_or_slug(tenant)
            if tenant_id is None:
                raise CommandError(f"no tenant {tenant!r}")
        rows = exports.usage_rows(
            start=datetime.combine(period_start, time.min, tzinfo=UTC),
            end=datetime.combine(period_end, time.min, tzinfo=UTC),
            tenant_id=tenant_id,
        )
        write_export(self, exports.USAGE_COLUMNS, rows, file_format=format, out=out)
