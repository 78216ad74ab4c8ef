"""Finishing the accounting of requests whose gateway died (the usage journal's leftovers).

A journal row older than `min_age` seconds belongs to a request that no live gateway is about to
account for: its gateway was killed (OOM, kill -9, a rollout past the grace period) after the
worker accepted it. The worker dropped the request when the gateway's connection did, and keeps
its final counts (its usage route), so the sweeper asks it and bills exactly what it generated,
settles the limiter (which also frees the request's concurrency seat) and deletes the row, in
the same transaction as the ledger row. A worker still running the request is asked again at the
next sweep. A worker that answers but does not know the request never had it (the gateway died
before sending it) or restarted since: nothing is billed and the reservation is released. A worker
that cannot be reached is asked again until `give_up_after` seconds; then the reservation itself
is billed (the estimated prompt and the rest as completion: the most the worker could have
served), as docs/billing.md says. Everything is idempotent on the request id: a live gateway finishing at the same moment, or
two sweepers, still bill once.

A live gateway whose limiter settlement failed (Redis did not answer) keeps the request's row with
its final counts; the sweeper settles those (and bills them, a no-op when the gateway's own write
landed) at the next sweep once the limiter answers, so an outage costs no settlement. A settlement
the sweeper itself cannot make is kept the same way for the next sweep.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from billing.events import UsageEvent
from common.asyncdb import db_call
from controlplane.gateway.models import InflightRequest
from controlplane.gateway.routing.workers import ModelTarget
from controlplane.gateway.usage import accounting, worker_usage
from controlplane.gateway.usage.sink import usage_sink
from controlplane.gateway.usage.worker_usage import WorkerCounts
from tenants.limits import Settlement, get_limiter
from tenants.models import Tenant
from tenants.selectors import tenant_limits

log = logging.getLogger("tessera.gateway")
BATCH = 500


@dataclass(slots=True)
class SweepReport:
    billed_from_worker: list[str] = field(default_factory=list)
    billed_reservation: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # the worker could not answer yet
    refused: list[str] = field(default_factory=list)  # the ledger refused the event (logged)
    resettled: list[str] = field(default_factory=list)  # a live gateway's failed settlement, settled now

    def as_dict(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in self.__slots__}


def _orphans(older_than: dt.datetime) -> list[InflightRequest]:
    """Rows a dead gateway left (old enough), and rows whose settlement failed (any age)."""
    rows = InflightRequest.objects.filter(Q(admitted_at__lte=older_than) | Q(unsettled_prompt_tokens__isnull=False))
    return list(rows.order_by("admitted_at")[:BATCH])


def _marked_counts(row: InflightRequest) -> WorkerCounts | None:
    if row.unsettled_prompt_tokens is None:
        return None
    return WorkerCounts(row.unsettled_prompt_tokens, row.unsettled_cached_tokens or 0, row.unsettled_completion_tokens or 0)


def _limits(tenant_id: int):
    return tenant_limits(tenant=Tenant.objects.select_related("tier").get(pk=tenant_id))


def _write(event: UsageEvent, settled: bool) -> bool:
    """Bill the event (idempotent) and finish the row, or keep it, with the counts, to settle again."""
    sink = usage_sink()
    rows = InflightRequest.objects.filter(request_id=event.request_id)
    try:
        with transaction.atomic():
            sink(event=event)
            if settled:
                rows.delete()
            else:
                rows.update(unsettled_prompt_tokens=event.prompt_tokens, unsettled_cached_tokens=event.cached_tokens,
                            unsettled_completion_tokens=event.completion_tokens)
        return True
    except Exception:
        # Refused (the tenant is gone, a malformed row): retrying cannot help; drop the row, loudly.
        log.exception("swept usage event refused", extra={"request_id": event.request_id, "event": repr(event)})
        rows.delete()
        return False


async def _bill(row: InflightRequest, counts: WorkerCounts, now: dt.datetime) -> bool:
    event = UsageEvent(
        request_id=row.request_id, tenant_id=row.tenant_id, api_key_id=row.api_key_id, model=row.model,
        adapter=row.adapter or None, tier=row.tier, prompt_tokens=counts.prompt_tokens,
        cached_tokens=counts.cached_tokens, completion_tokens=counts.completion_tokens, ttft_ms=None,
        latency_ms=(now - row.created_at).total_seconds() * 1000,
        status="error",  # the client's connection died with its gateway: the platform failed it
        created_at=row.created_at, http_status=None, batch_id=row.batch_id or None, embeddings=row.embeddings,
        batch_line=row.batch_line or None, worker_url=row.worker_url,
    )
    actual_spend = 0
    if row.reserved_spend_nano:
        target = ModelTarget(name=row.adapter or row.model, base=row.model, adapter=row.adapter or None)
        try:
            actual_spend = await accounting.price_nano(
                target=target, tier=row.tier, prompt_tokens=counts.prompt_tokens,
                completion_tokens=counts.completion_tokens, at=row.created_at, batch=bool(row.batch_id),
                embeddings=row.embeddings)
        except Exception:
            log.exception("price estimate failed; keeping the reserved spend", extra={"request_id": row.request_id})
            actual_spend = row.reserved_spend_nano
    settled = True
    try:
        limits = await db_call(_limits, row.tenant_id)
        await get_limiter().settle(Settlement(
            row.tenant_id, row.request_id, limits, row.period_start, row.reserved_tokens,
            counts.prompt_tokens + counts.completion_tokens, row.reserved_spend_nano, actual_spend))
    except Exception:
        log.warning("swept settle failed; settling again at the next sweep", exc_info=True,
                    extra={"request_id": row.request_id})
        settled = False
    return await db_call(_write, event, settled)


async def sweep(*, min_age: float | None = None, give_up_after: float | None = None,
                now: dt.datetime | None = None) -> SweepReport:
    min_age = settings.TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS if min_age is None else min_age
    give_up_after = settings.TESSERA_USAGE_SWEEP_GIVE_UP_SECONDS if give_up_after is None else give_up_after
    now = now or dt.datetime.now(dt.UTC)
    report = SweepReport()
    for row in await db_call(_orphans, now - dt.timedelta(seconds=min_age)):
        marked = _marked_counts(row)
        if marked is not None:  # its gateway knew the counts but could not settle them
            billed = await _bill(row, marked, now)
            (report.resettled if billed else report.refused).append(row.request_id)
            continue
        answer = await worker_usage.ask(row.worker_url, row.request_id)
        if answer is not None and answer.state == "running":
            report.still_running.append(row.request_id)
            continue
        if answer is not None and answer.state in ("finished", "unknown"):
            # Unknown to a worker that answers: it never had the request (the gateway died before
            # sending it) or restarted since (what it served died with it): nothing to bill, release.
            counts = answer.counts or WorkerCounts(0, 0, 0)
            billed = await _bill(row, counts, now)
            (report.billed_from_worker if billed else report.refused).append(row.request_id)
            continue
        if (now - row.admitted_at).total_seconds() < give_up_after:
            report.waiting.append(row.request_id)
            continue
        prompt = min(row.prompt_estimate, row.reserved_tokens)
        log.warning("no worker knows this request; billing its reservation", extra={"request_id": row.request_id})
        billed = await _bill(row, WorkerCounts(prompt, 0, row.reserved_tokens - prompt), now)
        (report.billed_reservation if billed else report.refused).append(row.request_id)
    if any(report.as_dict().values()):
        log.info("usage sweep", extra=report.as_dict())
    return report
