"""The one way audit events leave the table: pruning by age (TESSERA_AUDIT_RETENTION_DAYS).

On PostgreSQL the DELETE runs in a transaction that sets `tessera.audit_prune = 'on'`, the only
thing the trigger of migration 0002 lets through; elsewhere it bypasses the refusing queryset.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from .models import AuditEvent
from .writer import record

log = logging.getLogger("tessera.audit")


def retention_days() -> int:
    return int(getattr(settings, "TESSERA_AUDIT_RETENTION_DAYS", 400))


def audit_events_prune(*, days: int | None = None, now: datetime | None = None) -> int:
    """Delete events older than `days` (default: the setting; 0 keeps everything). Returns how many."""
    days = retention_days() if days is None else days
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL tessera.audit_prune = 'on'")
        cursor.execute(f"DELETE FROM {table} WHERE at < %s", [cutoff])  # noqa: S608 - the table name is ours
        removed = cursor.rowcount
        if removed:  # the prune is itself a change to the history: say who ran it and what it took
            record("audit.prune", type_="audit.auditevent", object_repr=f"events before {cutoff.isoformat()}",
                   changes={"removed": [None, removed], "retention_days": [None, days]})
    log.info("audit events pruned", extra={"removed": removed, "retention_days": days, "cutoff": cutoff.isoformat()})
    return removed
