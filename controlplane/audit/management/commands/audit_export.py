"""`manage.py audit_export [--format csv|jsonl] [--out FILE] [--tenant ID|SLUG] [--since ..] [--until ..]`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.audit import exports, selectors
from controlplane.audit.api.views import instant
from tenants.selectors import tenant_id_by_id_or_slug


class Command(BaseCommand):
    help = "Export audit events, oldest first (CSV to standard output unless --out is given)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--format", choices=exports.FORMATS, default="csv")
        parser.add_argument("--out", help="file to write (default: standard output)")
        parser.add_argument("--tenant", help="tenant id or slug (default: every tenant and the platform)")
        parser.add_argument("--action", help='an action ("tenant.suspend") or a family ("tenant")')
        parser.add_argument("--since", help="ISO date or datetime, inclusive")
        parser.add_argument("--until", help="ISO date or datetime, exclusive")

    def handle(self, *args, format: str, out: str | None, tenant: str | None, action: str | None,
               since: str | None, until: str | None, **options) -> None:
        tenant_id = None
        if tenant:
            tenant_id = tenant_id_by_id_or_slug(tenant)
            if tenant_id is None:
                raise CommandError(f"no tenant {tenant!r}")
        try:
            bounds = {"since": instant(since, "since"), "until": instant(until, "until")}
        except Exception as exc:  # noqa: BLE001 - DRF's ValidationError, said as a command error
            raise CommandError(str(exc)) from None
        events = selectors.audit_events(tenant_id=tenant_id, all_tenants=True, action=action, **bounds)
        chunks = exports.stream(format, events)
        if out:
            with open(out, "w", newline="", encoding="utf-8") as target:
                target.writelines(chunks)
            return
        for chunk in chunks:
            self.stdout.write(chunk, ending="")
