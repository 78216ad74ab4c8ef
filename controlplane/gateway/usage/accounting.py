"""After a request: settle its reservation and emit its one usage event, off the response path.

`Meter.finish` is idempotent and schedules the work as a background task, so neither the last
byte of a response nor a client disconnect waits on Redis or the database. The usage sink
(billing's `usage_record_ingest`) is idempotent on the request id; usage_writer.py batches the
writes on one thread and retries failures, which can never bill twice.

Token counts are the worker's: its usage object when the request completed, otherwise (the client
left, the stream broke) what the worker answers when asked for the request's final counts, and
only when the worker cannot be asked, its cumulative counts at the last event relayed. A request
for which none of these exists stays in the usage journal (journal.py) for the sweeper.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal

from django.conf import settings
from django.db.models import Exists, OuterRef, Sum

from billing import selectors as billing_selectors
from billing.events import UsageEvent
from billing.models import UsageRecord
from common import write_priority
from common.asyncdb import db_call
from controlplane.gateway import outages
from controlplane.gateway.models import InflightRequest
from controlplane.gateway.routing.workers import ModelTarget
from controlplane.gateway.usage import journal, renewal, usage_queue, usage_writer
from controlplane.gateway.usage.sink import is_async, usage_sink
from controlplane.gateway.usage.worker_usage import WorkerCounts
from controlplane.slo import metrics as slo_metrics
from tenants.auth import KeyPrincipal
from tenants.limits import BudgetSeed, LimitPlan, Settlement, get_limiter
from tenants.limits.base import to_nano
from tenants.services import api_keys_touch

log = logging.getLogger("tessera.gateway")

_pending: set[asyncio.Task] = set()
_by_request: dict[str, asyncio.Task] = {}  # request id -> its accounting task, until it is done


def spawn(coro) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(coro)
    _pending.add(task)
    task.add_done_callback(_pending.discard)
    return task


async def accounted(request_id: str) -> None:
    """Wait until this request's usage is durable (ledger, Redis queue or spool) or left to the
    sweeper: a batch line is marked answered only after this, so a runner killed in between leaves
    the line running (re-sent under the same id, billed once) rather than answered and unbilled."""
    task = _by_request.get(request_id)
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)


async def drain() -> None:
    """Wait for this loop's accounting tasks (tests, and the ASGI shutdown)."""
    loop = asyncio.get_running_loop()
    while mine := [t for t in _pending if t.get_loop() is loop and not t.done()]:
        await asyncio.gather(*mine, return_exceptions=True)


# --- prices and the ledger's figures (billing/selectors.py) ---------------------------------------


MTOK = 1_000_000
RATE_CACHE_SECONDS = 60.0
_rates: dict[tuple, tuple[float, Decimal, Decimal]] = {}


def _rates_per_mtok(*, target: ModelTarget, tier: str, at, batch: bool, embeddings: bool = False
                    ) -> tuple[Decimal, Decimal]:
    estimate = billing_selectors.price_estimate
    kwargs = dict(model=target.base, adapter=target.adapter, tier=tier, at=at, batch=batch)
    if embeddings:  # the embeddings price line (billing.models.Price.embedding_input_per_mtok)
        kwargs["embeddings"] = True
    return (
        Decimal(estimate(prompt_tokens=MTOK, completion_tokens=0, **kwargs)),
        Decimal(estimate(prompt_tokens=0, completion_tokens=MTOK, **kwargs)),
    )


async def price_nano(*, target: ModelTarget, tier: str, prompt_tokens: int, completion_tokens: int, at,
                     batch: bool = False, embeddings: bool = False) -> int:
    """billing.selectors.price_estimate, without a database query per request: its estimate is
    linear in the token counts (exact per-Mtok rates), so the two rates are cached per model,
    adapter and tier for RATE_CACHE_SECONDS (a price change reaches reservations that much later;
    the ledger prices every request itself at write time)."""
    key = (target.base, target.adapter, tier, batch, embeddings)
    cached = _rates.get(key)
    if cached is None or cached[0] < time.monotonic():
        prompt_rate, completion_rate = await db_call(_rates_per_mtok, target=target, tier=tier, at=at, batch=batch,
                                                     embeddings=embeddings)
        cached = (time.monotonic() + RATE_CACHE_SECONDS, prompt_rate, completion_rate)
        _rates[key] = cached
    _, prompt_rate, completion_rate = cached
    return to_nano((prompt_rate * prompt_tokens + completion_rate * completion_tokens) / MTOK)


async def reservation_spend_nano(*, target: ModelTarget, tier: str, prompt_estimate: int, allowance: int, at,
                                 batch: bool = False, embeddings: bool = False) -> int:
    """The most a request may cost when the worker serves at most `allowance` tokens in all.

    The worker clamps completions to the allowance minus the real prompt, so the split between prompt
    and completion tokens is not known here. With the estimate's split priced, a prompt larger than
    estimated can only shift tokens from completion to prompt; that costs more only where prompt
    tokens are dearer than completion tokens, so the bound is the larger of the two prices.
    """
    estimate = min(prompt_estimate, allowance)
    split = await price_nano(target=target, tier=tier, prompt_tokens=estimate,
                             completion_tokens=allowance - estimate, at=at, batch=batch, embeddings=embeddings)
    all_prompt = await price_nano(target=target, tier=tier, prompt_tokens=allowance, completion_tokens=0, at=at,
                                  batch=batch, embeddings=embeddings)
    return max(split, all_prompt)


def _budget_seed(tenant_id: int, period: dt.date, with_spend: bool) -> BudgetSeed:
    start = dt.datetime(period.year, period.month, 1, tzinfo=dt.UTC)
    end = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)  # requests that started this month, to now
    tokens = billing_selectors.tenant_tokens(tenant=tenant_id, start=start, end=end)
    spend = to_nano(Decimal(billing_selectors.tenant_spend(tenant=tenant_id, start=start, end=end))) if with_spend else 0
    # Requests admitted but not yet in the ledger hold their reservations: counted at what was reserved.
    billed = UsageRecord.objects.filter(request_id=OuterRef("request_id"))
    inflight = (InflightRequest.objects.filter(tenant_id=tenant_id, period_start=period)
                .exclude(Exists(billed)).aggregate(tokens=Sum("reserved_tokens"), spend=Sum("reserved_spend_nano")))
    return BudgetSeed(tokens=tokens + int(inflight["tokens"] or 0),
                      spend_nano=spend + (int(inflight["spend"] or 0) if with_spend else 0))


async def budget_seed(tenant_id: int, period: dt.date, *, with_spend: bool) -> BudgetSeed:
    """What `period` has used so far, for a limiter whose counter for it is missing: a new month, or
    Redis restarted without persistence. The ledger's rows plus the journal's in-flight reservations,
    so a hard budget is as hard after the restart as before it."""
    return await db_call(_budget_seed, tenant_id, period, with_spend)


# --- the meter ----------------------------------------------------------------------------------------


@dataclass(slots=True, weakref_slot=True, eq=False)  # held weakly, by identity, while renewed (renewal.py)
class Meter:
    request_id: str
    principal: KeyPrincipal
    target: ModelTarget
    plan: LimitPlan
    period: dt.date
    created_at: dt.datetime
    started: float  # perf_counter at arrival
    finished: bool = field(default=False)
    logs_content: bool = field(default=False)  # this request was sampled for content logs (operator opt-in)
    journaled: bool = field(default=False)  # a usage-journal row exists (the sweeper can finish the job)
    worker_url: str = field(default="")  # the worker the request was sent to
    batch_id: str = field(default="")  # a batch line's batch: its own price line, and no online SLO sample
    batch_line: str = field(default="")  # a batch line's ledger identity: billed once whichever attempt
    embeddings: bool = field(default=False)  # a /v1/embeddings request: the embeddings price line

    def finish(
        self,
        *,
        status: str,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        completion_tokens: int = 0,
        ttft_ms: float | None = None,
        http_status: int | None = None,
        itl_ms: float | None = None,
        resolve: Callable[[], Awaitable[WorkerCounts | None]] | None = None,
    ) -> None:
        """Account for the request once. Without `resolve` the counts given are final; with it, they
        are the fallback and `resolve()` (asking the worker) supplies the real ones off the response
        path. When neither gives counts (`resolve` answers None and no token was counted), the request
        is left to the sweeper: no settlement, no usage, its journal row kept."""
        if self.finished:
            return
        self.finished = True
        renewal.release(self)
        latency_ms = (time.perf_counter() - self.started) * 1000
        event = UsageEvent(
            request_id=self.request_id,
            tenant_id=self.principal.tenant_id,
            api_key_id=self.principal.key_id,
            model=self.target.base,
            adapter=self.target.adapter,
            tier=self.principal.limits.tier,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
            ttft_ms=ttft_ms,
            latency_ms=latency_ms,
            status=status,
            created_at=self.created_at,
            http_status=http_status,
            itl_ms=itl_ms,
            batch_id=self.batch_id or None,
            embeddings=self.embeddings,
            batch_line=self.batch_line or None,
            worker_url=self.worker_url,  # whose replica-hour the request's cost is a share of (billing/costs)
        )
        limits = self.principal.limits
        if self.batch_id:  # batch lines are not the online tiers' traffic: they would skew their SLIs
            task = _by_request[self.request_id] = spawn(self._account(event, resolve))
            task.add_done_callback(lambda _t, rid=self.request_id: _by_request.pop(rid, None))
            return
        slo_metrics.observe_request(
            tier=limits.tier, model=self.target.name, http_status=http_status,
            platform_failed=status == "error" and (http_status is None or http_status >= 500),
            latency_s=latency_ms / 1000, ttft_ms=ttft_ms, itl_ms=itl_ms,
            ttft_target_ms=limits.slo_ttft_p95_ms, itl_target_ms=limits.slo_itl_p95_ms,
        )
        spawn(self._account(event, resolve))

    async def _account(self, event: UsageEvent, resolve=None) -> None:
        write_priority.current.set(write_priority.BACKGROUND)  # after the response: nobody waits on its settle
        if resolve is not None:
            counts = await resolve()
            if counts is not None:
                event = replace(event, prompt_tokens=counts.prompt_tokens, cached_tokens=counts.cached_tokens,
                                completion_tokens=counts.completion_tokens)
            elif event.prompt_tokens == event.completion_tokens == 0 and self.journaled:
                log.warning("no counts for this request yet; left to the usage sweeper",
                            extra={"request_id": self.request_id})
                return
        actual_tokens = event.prompt_tokens + event.completion_tokens
        actual_spend = 0
        if self.plan.spend_nano:
            try:
                actual_spend = await price_nano(
                    target=self.target, tier=event.tier, prompt_tokens=event.prompt_tokens,
                    completion_tokens=event.completion_tokens, at=event.created_at, batch=bool(self.batch_id),
                    embeddings=self.embeddings,
                )
            except Exception:
                log.exception("price estimate failed; keeping the reserved spend", extra={"request_id": self.request_id})
                actual_spend = self.plan.spend_nano
        try:
            await get_limiter().settle(
                Settlement(
                    self.principal.tenant_id, self.request_id, self.principal.limits, self.period,
                    self.plan.tokens, actual_tokens, self.plan.spend_nano, actual_spend,
                )
            )
        except Exception as exc:
            # Redis (or the database) did not answer: the reservation stays charged for now. With a
            # journal row, keep it with what to settle; the sweeper settles it once the limiter answers.
            if outages.dependency_of(exc) is not None:  # an outage: one line, not a traceback per request
                log.warning("settle failed; the sweeper settles it", extra={"request_id": self.request_id,
                                                                             "error": repr(exc)[:200]})
            else:
                log.exception("settle failed", extra={"request_id": self.request_id})
            if self.journaled:
                try:
                    await usage_writer.mark_unsettled(self.request_id, prompt=event.prompt_tokens,
                                                 cached=event.cached_tokens, completion=event.completion_tokens)
                except Exception:  # the row stays, unmarked, for the sweeper (which asks the worker)
                    log.exception("could not mark the journal row unsettled", extra={"request_id": self.request_id})
        await record_usage(event)
        log.info(
            "request finished",
            extra={
                "request_id": event.request_id, "tenant": self.principal.tenant_slug, "key": self.principal.key_prefix,
                "model": event.model, "adapter": event.adapter, "status": event.status,
                "prompt_tokens": event.prompt_tokens, "cached_tokens": event.cached_tokens,
                "completion_tokens": event.completion_tokens, "ttft_ms": event.ttft_ms,
                "latency_ms": round(event.latency_ms, 2), "http_status": event.http_status, "itl_ms": event.itl_ms,
                "tier": event.tier,
            },
        )


async def record_usage(event: UsageEvent) -> None:
    sink = usage_sink()
    if is_async(sink):
        try:
            await sink(event=event)
            await journal.forget_async([event.request_id])
        except Exception:
            log.exception("usage event NOT recorded", extra={"request_id": event.request_id, "event": repr(event)})
        return
    if settings.TESSERA_USAGE_QUEUE == "redis":
        try:
            await usage_queue.push(event)
            return
        except Exception:  # Redis unavailable: write it ourselves rather than lose it
            log.warning("usage queue unavailable; writing inline", exc_info=True, extra={"request_id": event.request_id})
    await usage_writer.writer_for(sink).submit(event)


# --- last use of keys: at most one write per key per minute, per process ----------------------------

TOUCH_EVERY = 60.0
_last_touch: dict[int, float] = {}


def note_key_used(key_id: int) -> None:
    now = time.monotonic()
    if now - _last_touch.get(key_id, -TOUCH_EVERY) < TOUCH_EVERY:
        return
    _last_touch[key_id] = now
    spawn(_touch(key_id, dt.datetime.now(dt.UTC)))


async def _touch(key_id: int, at: dt.datetime) -> None:
    try:
        await db_call(api_keys_touch, used={key_id: at})
    except Exception:
        log.warning("could not record key use", exc_info=True, extra={"key_id": key_id})
