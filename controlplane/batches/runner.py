"""Running a batch's lines through the gateway's own request path, in the Celery worker's process.

Each line goes through `proxy.handle` with the batch's key principal (so its limits, budgets, usage
journal, exact metering and billing are a direct request's to the batch's endpoint: chat, completions
or embeddings, each on its own price line at the batch share), under its line's request id and marked
with the batch, at X-Priority TESSERA_BATCH_PRIORITY (after every online tier in the worker's
scheduler; the gateway's shedding refuses it first). A line is sent only while some worker that
serves its model has nothing waiting and a free seat: batch work fills what online traffic leaves.

Retries: a 429 that is a rate limit or shedding, and a 502/503 that says no worker could take the
line, wait (Retry-After) without counting as a try; any other 5xx is retried with backoff up to TESSERA_BATCH_LINE_ATTEMPTS; any other error (a hard budget's
`insufficient_quota` included) fails the line with the error in the error file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import orjson
from django.http import HttpRequest

from controlplane.asyncdb import db_call
from controlplane.errors import ApplicationError
from controlplane.gateway import accounting, proxy, upstream
from controlplane.gateway.workers import get_registry

from . import conf, lines, output
from .finalize import batch_finalize
from .models import Batch, BatchLine
from .services import ENDPOINTS, TERMINAL, batch_validate

log = logging.getLogger("tessera.batches")
WAIT_FOR_ROOM = 0.1  # seconds between looks for room while lines are in flight
BUSY = "busy"  # another runner holds the batch's lease
RETRYABLE_429 = {"rate_limit_exceeded", "overloaded", "priority_shed"}
# No worker could take the line (none ready, none reachable, usage not recordable): the line never ran,
# so waiting costs it no try; an outage of any length ends in the batch finishing, not failing.
NOT_RUN = {"model_unavailable", "upstream_unavailable", "usage_unavailable"}


def _principal(batch: Batch):
    from tenants import auth
    from tenants.models import APIKey

    key_hash = APIKey.objects.filter(pk=batch.api_key_id).values_list("key_hash", flat=True).first()
    principal = auth.check(auth._load(key_hash) if key_hash else None)
    limits = dataclasses.replace(principal.limits, priority=conf.batch_priority())
    return dataclasses.replace(principal, limits=limits)


def _recover_sync(line: BatchLine):
    """Decide a stale running line's fate; the journal row to release, if any."""
    from billing.models import UsageRecord
    from controlplane.gateway.models import InflightRequest

    billed = UsageRecord.objects.filter(request_id=line.request_id).values_list(
        "prompt_tokens", "completion_tokens").first() if line.request_id else None
    reuse = billed is not None and sum(billed) > 0
    row = InflightRequest.objects.filter(request_id=line.request_id).first() if line.request_id else None
    lines.line_requeue_stale(line_id=line.pk, reuse_request_id=reuse)
    return row, (sum(billed) if billed else 0)


async def _release(row, actual_tokens: int) -> None:
    from controlplane.gateway.sweeper import _limits
    from tenants.limits import Settlement, get_limiter

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


async def _send(batch: Batch, principal, line: BatchLine) -> None:
    try:
        await _send_once(batch, principal, line)
    except Exception:  # a bug or an outage mid-line: the line is tried again, never left running
        log.exception("batch line raised; retrying it", extra={"batch": batch.pk, "custom_id": line.custom_id})
        await db_call(lines.line_retry, line_id=line.pk, request_id=line.request_id, after_seconds=2.0,
                      count_attempt=True)


async def _send_once(batch: Batch, principal, line: BatchLine) -> None:
    response = await proxy.handle(HttpRequest(), ENDPOINTS[batch.endpoint], body=orjson.dumps(line.body),
                                  principal=principal, request_id=line.request_id, batch_id=batch.id)
    status, content = output.capped(response.status_code, response.content)  # parsed and stored only under the cap
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        body = {"error": {"message": "The worker's answer was not JSON.", "type": "server_error", "code": "bad_answer"}}
    error = body.get("error") if isinstance(body, dict) and status != 200 else None
    code = (error or {}).get("code") if isinstance(error, dict) else None
    if (status == 429 and code in RETRYABLE_429) or code in NOT_RUN:
        wait = float(response.headers.get("Retry-After", "1") or 1)
        await db_call(lines.line_retry, line_id=line.pk, request_id=line.request_id, after_seconds=wait,
                      count_attempt=False)
        return
    if status >= 500 and line.attempts < conf.max_attempts():
        await db_call(lines.line_retry, line_id=line.pk, request_id=line.request_id,
                      after_seconds=min(2.0 ** line.attempts, 30.0), count_attempt=True)
        return
    await accounting.accounted(line.request_id)  # billed durably before the line says answered
    line_error = None if status == 200 else {"code": code or "request_failed",
                                             "message": (error or {}).get("message", f"HTTP {status}")}
    await db_call(lines.line_answer, line_id=line.pk, request_id=line.request_id, ok=status == 200,
                  status_code=status, body=body, error=line_error)


async def _fail_all(batch: Batch, exc: ApplicationError) -> None:
    def fail() -> None:
        BatchLine.objects.filter(batch_id=batch.pk, state__in=[BatchLine.State.PENDING, BatchLine.State.RUNNING]).update(
            state=BatchLine.State.FAILED, status_code=exc.status, response=exc.openai_body(),
            error={"code": exc.code, "message": exc.message})

    await db_call(fail)


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
        try:
            principal = await db_call(_principal, batch)
        except ApplicationError as exc:  # the key was revoked or deleted: its lines cannot run
            await _fail_all(batch, exc)
        else:
            await _run_lines(batch, principal)
        # Every answered line's usage is in the ledger (or the spool) before the batch says completed.
        await accounting.drain()
        await db_call(lines.mark_finalizing, batch_id=batch_id)
        return (await db_call(batch_finalize, batch_id=batch_id)).status
    finally:
        await accounting.drain()
        await upstream.close()


async def _run_lines(batch: Batch, principal) -> None:
    registry = get_registry()
    await registry.ensure_polling()
    in_flight: set[asyncio.Task] = set()
    limit = conf.batch_concurrency()
    model = await db_call(_first_model, batch.pk)  # where room is looked for (a batch is mostly one model)
    renewed = 0.0
    while True:
        if time.monotonic() - renewed > 1.0:
            renewed = time.monotonic()
            status = await db_call(lines.lease_renew, batch_id=batch.pk)
            if status == Batch.Status.CANCELLING or await db_call(_expired, batch.pk):
                break  # in-flight lines finish below; unsent ones are failed by finalize
        free = min(limit - len(in_flight), room(model, len(in_flight)))
        claimed = await db_call(lines.line_claim, batch_id=batch.pk, limit=free) if free > 0 else []
        for line in claimed:
            in_flight.add(asyncio.create_task(_send(batch, principal, line)))
        if not in_flight:
            if not await db_call(lines.lines_left, batch_id=batch.pk):
                break
            await asyncio.sleep(0.2)  # lines waiting out a Retry-After, or no room
            continue
        done, in_flight = await asyncio.wait(in_flight, timeout=WAIT_FOR_ROOM, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is not None:
                log.error("batch line failed in the runner", exc_info=task.exception(), extra={"batch": batch.pk})
    if in_flight:
        await asyncio.gather(*in_flight, return_exceptions=True)


def _first_model(batch_id: str) -> str:
    body = BatchLine.objects.filter(batch_id=batch_id).order_by("line_no").values_list("body", flat=True).first()
    return (body or {}).get("model", "")


def _expired(batch_id: str) -> bool:
    from django.utils import timezone

    return Batch.objects.filter(pk=batch_id, expires_at__lte=timezone.now()).exists()
