"""`manage.py billing_invoices --month 2026-11 [--finalize]`: draft (and finalize) a month's invoices."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from billing.models import Invoice
from billing.services import invoices_build_month
from common.instants import parse_month


class Command(BaseCommand):
    help = "Draft (or refresh) every tenant's invoice for a month; --finalize freezes them."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--month", required=True, help="YYYY-MM (UTC calendar month)")
        parser.add_argument("--finalize", action="store_true")

    def handle(self, *args, month: str, finalize: bool, **options) -> None:
        try:
            first = parse_month(month)
        except ValueError:
            raise CommandError(f"--month must be YYYY-MM, got {month!r}") from None
        ids = invoices_build_month(month=first, finalize=finalize)
        for invoice in Invoice.objects.filter(pk__in=ids).order_by("tenant_id"):
            self.stdout.write(f"{invoice.pk}\t{invoice.tenant_id}\t{invoice.status}\t{invoice.currency}\t{invoice.total}")
