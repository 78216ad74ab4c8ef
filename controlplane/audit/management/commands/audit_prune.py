"""`manage.py audit_prune [--days N]`: delete audit events older than the retention period."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.retention import audit_events_prune, retention_days


class Command(BaseCommand):
    help = "Delete audit events older than TESSERA_AUDIT_RETENTION_DAYS (or --days)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--days", type=int, help=f"keep this many days (default: the setting, {retention_days()})")

    def handle(self, *args, days: int | None = None, **options) -> None:
        if days is not None and days < 1:
            raise CommandError("--days must be at least 1 (set TESSERA_AUDIT_RETENTION_DAYS=0 to keep everything)")
        self.stdout.write(f"{audit_events_prune(days=days)} audit event(s) deleted")
