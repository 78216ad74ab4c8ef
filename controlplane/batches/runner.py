"""Running a batch's lines through the gateway's own request path, in the Celery worker's process.

Each line goes through `proxy.handle` (send.py) with the batch's key principal (so its limits, budgets,
usage journal, exact metering and billing are a direct request's to the batch's endpoint: chat,
completions or embeddings, each on its own price line at the batch share), under its attempt's
request id and the line's ledger identity, marked with the batch, at X-Priority
TESSERA_BATCH_PRIORITY (after every online tier in the worker's scheduler; the gateway's shedding
refuses it first). A line is sent only while some worker that serves its model has nothing waiting
and a free seat: batch work fills what online traffic leaves.

The key is checked before each line is sent, from the gateway's key cache (principal.py): once it is
revoked, expired or deleted, or its tenant suspended, the lines not yet sent fail with the error an
online request would get, and the ones in flight finish. Once the batch's stored answers, with the
tenant's other files, reach its storage cap, no more lines are sent: the unsent ones fail
`storage_quota_exceeded`, unbilled (quota.py). The runner waits out a database outage
(send.db_waiting); one longer than TESSERA_BATCH_DB_WAIT_SECONDS ends the run with an error, and
the batch is resumed (its unanswered lines recovered) once the database is back.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.db.models import Q
from django.utils import timezone

from billing.models import UsageRecord
from common.asyncdb import db_call
from common.errors import ApplicationError
from controlplane.gateway import upstream
from controlplane.gateway.dependencies import dependency_of
from controlplane.gateway.models import InflightRequest
from controlplane.gateway.routing.workers import get_registry
from controlplane.gateway.usage import accounting
from controlplane.gateway.usage.sweeper import _limits
from tenants.limits import Settlement, get_limiter

from . import conf, lines, output, principal, quota
from .finalize import batch_finalize
from .models import Batch, BatchLine
from .send import db_waiting, send
from .services import TERMINAL, batch_validate

log = logging.getLogger("tessera.batches")
WAIT_FOR_ROOM = 0.1  # seconds between looks for room while lines are in flight
BUSY = "busy"  # another runner holds the batch's lease


def _recover_sync(line: BatchLine):
    """Decide a stale running line's fate; the journal row to release, if any."""
    # The line's ledger row, under whichever attempt's id (a row written before ledger rows carried the
    # line's identity is found by its request id).
    billed_here = Q(batch_line=lines.line_ledger_key(batch_id=line.batch_id, custom_id=line.custom_id))
    if line.request_id:
        billed_here |= Q(request_id=line.request_id)
    billed = UsageRecord.objects.filter(billed_here).values_list("request_id", "prompt_tokens",
                                                                  "completion_tokens").first()
    tokens = billed[1] + billed[2] if billed else 0
    row = InflightRequest.objects.filter(request_id=line.request_id).first() if line.request_id else None
    lines.line_requeue_stale(line_id=line.pk, billed_request_id=billed[0] if tokens else "")
    return row, (tokens if billed and billed[0] == line.request_id else 0)


async def _release(row, actual_tokens: int) -> None:
    limits = await db_call(_limits, row.tenant_id)
    await get_limiter().settle(Settlement(row.tenant_id, row.request_id, limits, row.period_start,
                                          row.reserved_tokens, actual_tokens, row.reserved_spend_nano, 0))
    await db_call(lambda: type(row).objects.filter(pk=row.pk).delete())


async def recover(batch_id: str) -> int:
    stale = await db_call(lines.stale_lines, batch_id=batch_id)
    for line in stale:
        row, actual = await db_call(_recover_sync, line)
        if row is not None:
            await _release(row, actual)
    if stale:
        log.info("batch lines recovered from a dead runner", extra={"batch": batch_id, "lines": len(stale)})
    return len(stale)


def room(model: str, in_flight: int) -> int:
    """How many more lines to send now, with `in_flight` of this runner's lines out. Per worker for
    `model`: its free seats plus TESSERA_BATCH_QUEUE_AHEAD lines queued while nothing else waits
    there; only TESSERA_BATCH_BUSY_SHARE lines while it runs online requests too (every line
    co-scheduled with them makes their steps longer); none while an online request waits."""
    registry = get_registry()
    workers = registry.candidates(model) if model in registry.known_models() else []
    if not workers:
        return max(1 - in_flight, 0)  # the proxy answers (503: the line waits, spending no try)
    ahead, busy_share = conf.queue_ahead(), conf.busy_share()
    total = 0
    for w in workers:
        ours_waiting = max(w.outstanding - w.seats, 0) if w.seats else 0
        if w.waiting - ours_waiting > 0:
            continue
        others_running = w.running - min(w.outstanding, w.seats or w.outstanding)
        total += busy_share if others_running > 0 else (w.seats + ahead if w.seats else conf.batch_concurrency())
    return max(total - in_flight, 0)


async def _fail_pending(batch: Batch, exc: ApplicationError) -> None:
    failed = await db_waiting(lines.lines_fail_pending, batch_id=batch.pk, status_code=exc.status,
                              body=exc.openai_body(), error={"code": exc.code, "message": exc.message})
    if failed:
        log.warning("the batch's key may no longer send; its unsent lines fail",
                    extra={"batch": batch.pk, "code": exc.code, "lines": failed})


async def _fail_unsent_over_cap(batch: Batch, gauge: quota.Gauge) -> None:
    failed = await db_waiting(lines.lines_fail_over_cap, batch_id=batch.pk, not_run=quota.not_run_error(gauge.cap),
                              billed=output.quota_error(gauge.cap))
    if failed:
        log.warning("the batch's answers reached the tenant's storage cap; its unsent lines fail",
                    extra={"batch": batch.pk, "lines": failed, "cap": gauge.cap})


async def run(batch_id: str) -> str:
    """Run what is left of a batch and finalize it; the batch's status at the end ('busy' when
    another live runner holds it)."""
    validated = await db_call(batch_validate, batch_id=batch_id)
    if validated.status == Batch.Status.FAILED:
        return validated.status
    batch, held = await db_call(lines.lease_take, batch_id=batch_id)
    if not held:
        return batch.status if batch.status in TERMINAL else BUSY
    try:
        await recover(batch_id)
        key_hash = await db_call(principal.key_hash_of, batch.api_key_id)
        await _run_lines(batch, key_hash)
        # Every answered line's usage is in the ledger (or the spool) before the batch says completed.
        await accounting.drain()
        await db_waiting(lines.mark_finalizing, batch_id=batch_id)
        return (await db_waiting(batch_finalize, batch_id=batch_id)).status
    finally:
        await accounting.drain()
        await upstream.close()


async def _run_lines(batch: Batch, key_hash: str | None) -> None:
    registry = get_registry()
    await registry.ensure_polling()
    in_flight: set[asyncio.Task] = set()
    limit = conf.batch_concurrency()
    model = await db_waiting(_first_model, batch_id=batch.pk)  # where room is looked for (mostly one model)
    renewed = 0.0
    failures: list[BaseException] = []
    refused: ApplicationError | None = None  # the key may no longer send
    gauge = await db_waiting(quota.gauge_of, batch=batch)  # the tenant's storage cap, counted in memory
    full = False  # the batch's answers reached it
    try:
        while not failures:
            if time.monotonic() - renewed > 1.0:
                renewed = time.monotonic()
                status = await db_waiting(lines.lease_renew, batch_id=batch.pk, output_bytes=gauge.own)
                if status == Batch.Status.CANCELLING or await db_waiting(_expired, batch_id=batch.pk):
                    break  # in-flight lines finish below; unsent ones are failed by finalize
                gauge.elsewhere = await db_waiting(quota.elsewhere, tenant_id=batch.tenant_id, batch_id=batch.pk)
            if gauge.reached():  # no answer sent now could be kept: the unsent lines fail, unbilled
                full = True
                await _fail_unsent_over_cap(batch, gauge)
                break
            free = min(limit - len(in_flight), room(model, len(in_flight)), gauge.claimable(len(in_flight)))
            claimed = []
            if free > 0:
                try:
                    sender = await principal.current(key_hash)  # checked for every line, from memory
                except ApplicationError as exc:  # revoked, expired, deleted, suspended: what a request would get
                    refused = exc
                    await _fail_pending(batch, exc)
                    break
                except Exception as exc:
                    if dependency_of(exc) != "database":
                        raise
                    sender = None  # the key is not known from memory and the database is away: wait
                if sender is not None:
                    claimed = await db_waiting(lines.line_claim, batch_id=batch.pk, limit=free)
            for line in claimed:
                in_flight.add(asyncio.create_task(send(batch, sender, line)))
            if not in_flight:
                if not await db_waiting(lines.lines_left, batch_id=batch.pk):
                    break
                await asyncio.sleep(0.2)  # lines waiting out a Retry-After, or no room
                continue
            done, in_flight = await asyncio.wait(in_flight, timeout=WAIT_FOR_ROOM, return_when=asyncio.FIRST_COMPLETED)
            failures += [task.exception() for task in done if task.exception() is not None]
            for task in done:
                if task.exception() is None:
                    gauge.add(task.result())
    finally:
        if in_flight:
            results = await asyncio.gather(*in_flight, return_exceptions=True)
            failures += [r for r in results if isinstance(r, BaseException)]
    if refused is not None:  # a line in flight at the change that came back to be retried is not sent again
        await _fail_pending(batch, refused)
    if full:  # likewise a line in flight at the cap that came back to be retried
        await _fail_unsent_over_cap(batch, gauge)
    if failures:
        # A line whose outcome could not be stored (the database stayed away) is still `running`: this run
        # ends, and the next one (Celery's retry, or the resume sweep once the lease has passed) recovers it.
        log.error("batch run stopped: a line's outcome could not be stored", exc_info=failures[0],
                  extra={"batch": batch.pk})
        raise failures[0]


def _first_model(*, batch_id: str) -> str:
    body = BatchLine.objects.filter(batch_id=batch_id).order_by("line_no").values_list("body", flat=True).first()
    return (body or {}).get("model", "")


def _expired(*, batch_id: str) -> bool:
    return Batch.objects.filter(pk=batch_id, expires_at__lte=timezone.now()).exists()
