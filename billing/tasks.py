"""Celery tasks: take ids, load, call a service. Idempotent, acks late, bounded retries with backoff.

Nothing here runs on the serving path: the gateway only writes the ledger row; the sweepers
(`stripe_report_pending`, `stripe_sync_pending`, run by beat) pick up whatever is unreported, so a
Stripe or broker outage delays reporting and never blocks or loses a request.
"""

from __future__ import annotations

import logging
from datetime import date, timedelta

from celery import shared_task
from django.db import DatabaseError
from django.dispatch import receiver
from django.utils import timezone

from billing import services, signals, stripe_sync
from common.instants import parse_month

logger = logging.getLogger("tessera.billing")

RETRY = {
    "acks_late": True,
    "autoretry_for": (*stripe_sync.RETRYABLE_ERRORS, DatabaseError),
    "retry_backoff": True,
    "retry_backoff_max": 600,
    "retry_jitter": True,
    "max_retries": 8,
}
REPORT_BATCH = 100


@shared_task(name="billing.stripe_report_usage", **RETRY)
def stripe_report_usage(record_ids: list[int]) -> int:
    if not stripe_sync.stripe_enabled():
        return 0
    return stripe_sync.usage_report(record_ids=record_ids)


@shared_task(name="billing.stripe_report_pending", **RETRY)
def stripe_report_pending(limit: int = 2000) -> int:
    """Sweeper: queue meter-event reports for unreported usage, in batches of ids."""
    if not stripe_sync.stripe_enabled():
        return 0
    ids = stripe_sync.usage_pending_ids(limit=limit)
    for start in range(0, len(ids), REPORT_BATCH):
        stripe_report_usage.delay(ids[start : start + REPORT_BATCH])
    return len(ids)


@shared_task(name="billing.stripe_invoice_sync", **RETRY)
def stripe_invoice_sync(invoice_id: int) -> str:
    if not stripe_sync.stripe_enabled():
        return "disabled"
    return stripe_sync.invoice_push(invoice_id=invoice_id).stripe_status


@shared_task(name="billing.stripe_invoice_void", **RETRY)
def stripe_invoice_void(invoice_id: int) -> str:
    if not stripe_sync.stripe_enabled():
        return "disabled"
    return stripe_sync.invoice_void_push(invoice_id=invoice_id).stripe_status


@shared_task(name="billing.stripe_sync_pending", **RETRY)
def stripe_sync_pending(limit: int = 200) -> int:
    """Sweeper: finalized invoices that are not finalized in Stripe yet (lost enqueue, exhausted retries)."""
    if not stripe_sync.stripe_enabled():
        return 0
    ids = stripe_sync.invoices_pending_ids(limit=limit)
    for invoice_id in ids:
        stripe_invoice_sync.delay(invoice_id)
    return len(ids)


@shared_task(name="billing.usage_daily_rollup", **RETRY)
def usage_daily_rollup(day: str | None = None) -> int:
    """Rebuild one UTC day's roll-ups (default: today and yesterday, so late events land)."""
    days = [date.fromisoformat(day)] if day else [timezone.now().date() - timedelta(days=1), timezone.now().date()]
    return sum(services.usage_daily_rebuild(day=d) for d in days)


@shared_task(name="billing.invoices_build_month", **RETRY)
def invoices_build_month(month: str | None = None, finalize: bool = False) -> list[int]:
    """Draft (or finalize) a month's invoices; default: the previous month."""
    if month:
        first = parse_month(month)
    else:
        first = (timezone.now().date().replace(day=1) - timedelta(days=1)).replace(day=1)
    return services.invoices_build_month(month=first, finalize=finalize)


@shared_task(name="billing.replica_spans_observe", **RETRY)
def replica_spans_observe() -> int:
    """Extend every ready replica's serving span to now (beat: every minute; the span's resolution)."""
    return services.replica_spans_observe()


# Hours rebuilt by each run of cost_hours_rebuild: the sweeper's late usage (minutes) lands in the next
# run; beat also runs it once a day over 48 hours for a gateway's spool replayed after a long database
# outage. Older hours: `manage.py unit_economics --month M --rebuild`. Not every 24 hours every 15 minutes:
# a rebuild took ~0.11 ms a request (20,000 requests in 2.3 s, PostgreSQL on 2 shared cores).
COST_REBUILD_HOURS = 3


@shared_task(name="billing.cost_hours_rebuild", **RETRY)
def cost_hours_rebuild(hours: int = COST_REBUILD_HOURS) -> int:
    """Recompute the cost of the last `hours` hours, the current one included (idempotent). Returns requests costed."""
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    rebuilt = services.cost_hours_rebuild(start=now - timedelta(hours=hours - 1), end=now + timedelta(hours=1))
    return sum(hour.requests for hour in rebuilt)


@receiver(signals.stripe_push_wanted, dispatch_uid="billing.tasks.enqueue_stripe_push")
def enqueue_stripe_push(sender, *, invoice_id: int, action: str, **kwargs) -> None:
    """Hand a Stripe push to Celery. A broker outage must not undo billing: the sweeper retries later."""
    if not stripe_sync.stripe_enabled():
        return
    task = stripe_invoice_sync if action == "sync" else stripe_invoice_void
    try:
        task.delay(invoice_id)
    except Exception:  # noqa: BLE001 - any broker failure; stripe_sync_pending picks it up
        logger.exception("could not enqueue %s; the periodic sweep will retry", task.name, extra={"invoice_id": invoice_id})
