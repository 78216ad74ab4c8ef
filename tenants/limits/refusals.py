"""A tenant out of requests per minute is refused from memory until its bucket can hold a request again.

Under a flood from one tenant over its RPM, every request used to cost a limiter round trip (a Lua
script in Redis, a row lock in the database) to learn what the previous one had already said. A
requests-per-minute refusal is certain to hold until its retry-after: that bucket only refills at
its steady rate (nothing else raises it: settling refunds tokens, not requests), and other gateway
processes can only take from it. So this process remembers the refusal per tenant and answers the
tenant's requests until then with the same decision, its windows and retry-after moved on by the
time since (the tokens window's remaining count is the refill-projected one; a refund settled
meanwhile shows up at the next round trip).

A concurrency refusal is remembered too, but briefly: it ends when a slot frees, which this process
sees for its own requests (a settle here forgets it at once: `slot_freed`) but not for another
gateway's. So it is held CONCURRENCY_MEMORY_SECONDS at most: under a flood, one limiter round trip per
tenant per quarter second instead of one per request (on `make run`'s SQLite limiter each was a write
transaction that premium admissions queued behind; benchmarks.flood), and a slot freed by another
process is seen at most that late. Its Retry-After stays the limiter's.

Tokens-per-minute and hard-budget refusals (tokens, token_budget, spend_budget) are remembered the
same brief way: they too end early only through a settle (which refunds what a request did not use),
seen at once here and at most a quarter second late from elsewhere. They depend on the request's
size, so the memory refuses only a request at least as large as the refused one (tokens, and spend
where priced); a smaller one asks the limiter. Their Retry-After is moved on: the tokens bucket's
refill projected to the request's size, the month's end nearer by the time since.

A request too large for the tokens window still goes to the limiter, which answers `too_large`
first, as it always has. The memory is keyed by tenant and checked against the tenant's current
limits, so a tier change takes effect at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from .base import Decision, LimitPlan, TenantLimits, WindowState

_MAX = 100_000  # tenants remembered before the memory is emptied
CONCURRENCY_MEMORY_SECONDS = 0.25
_REMEMBERED = ("requests", "concurrency", "tokens", "token_budget", "spend_budget")
_SIZED = ("tokens", "token_budget", "spend_budget")  # refused for this size: a smaller request may fit


@dataclass(frozen=True, slots=True)
class _Refusal:
    limits: TenantLimits
    decision: Decision
    asked_at: float  # monotonic time the limiter was asked: its clock read at or after this
    until: float
    tokens: int  # the refused request's size: a sized refusal holds for requests at least this large
    spend_nano: int


_memo: dict[int, _Refusal] = {}
_lock = threading.Lock()
RECENT_SECONDS = 5.0  # a tenant refused (and remembered) this recently asks the limiter one request at a time
_refused_at: dict[int, float] = {}  # tenant -> monotonic time of its last remembered refusal
_queues: dict[tuple[int, int], list] = {}  # (event loop, tenant) -> [asyncio.Lock, requests using it]


def clear() -> None:
    with _lock:
        _memo.clear()
        _refused_at.clear()


def any_remembered() -> bool:
    return bool(_memo)


def remembers(tenant_id: int) -> bool:
    """Whether a refusal of this tenant is held (perhaps expired: recall decides)."""
    return tenant_id in _memo


def remember(plan: LimitPlan, decision: Decision, asked_at: float) -> None:
    """Keep a refusal the limiter gave for `plan` (one of _REMEMBERED), asked at monotonic `asked_at`."""
    if decision.allowed or decision.reason not in _REMEMBERED or decision.retry_after <= 0:
        return
    # The bucket reaches one request at the limiter's time of asking + retry_after, which is no earlier
    # than asked_at + retry_after: remembering until then never refuses what the limiter would admit.
    # A slot may free, or a settle refund tokens, any time: held briefly, and forgotten at once when a
    # request of the tenant settles here.
    held = decision.retry_after if decision.reason == "requests" else min(decision.retry_after,
                                                                            CONCURRENCY_MEMORY_SECONDS)
    entry = _Refusal(plan.limits, decision, asked_at, asked_at + held, plan.tokens, plan.spend_nano)
    with _lock:
        if len(_memo) >= _MAX:
            _memo.clear()
            _refused_at.clear()
        _memo[plan.tenant_id] = entry
        _refused_at[plan.tenant_id] = asked_at


@asynccontextmanager
async def one_at_a_time(tenant_id: int, *, always: bool = False) -> AsyncIterator[None]:
    """Around a limiter call: a tenant with a refusal remembered in the last RECENT_SECONDS (or any
    tenant, with `always`: a limiter whose decisions for a tenant queue on a lock anyway) asks the
    limiter one request at a time in this process, each after the one before has answered.

    When its remembered refusal ends (a quarter second for a concurrency refusal, or a slot settling
    here), every request of the flood in flight would otherwise go to the limiter at once: on make
    run's SQLite that was a burst of write transactions, and of threads of the executor, that a paying
    tenant's reservation and key lookup queued behind. In turn, the first asks; if it is refused again
    the rest are answered from memory (the caller recalls after entering), and if a slot had freed it
    takes it and the next one asks. Any other tenant passes straight through, unless `always`.

    `always` is for the database limiter: each of its decisions holds the tenant's row (SQLite: the
    process's one write lock) to the end, so a tenant's requests wait for each other there anyway. In
    parallel they waited holding threads of the database executor: a new tenant's first burst (48
    requests, none refused yet, each also seeding its month counter) took all six of a 2-core
    gateway's for ~80 ms, and every other tenant's reservation and key lookup queued behind them
    (benchmarks.flood, the flood's first second). In turn they hold one thread, and once one is
    refused the rest are answered from memory."""
    refused = _refused_at.get(tenant_id)
    if not always and (refused is None or time.monotonic() - refused > RECENT_SECONDS):
        yield
        return
    key = (id(asyncio.get_running_loop()), tenant_id)
    queue = _queues.get(key)
    if queue is None:
        queue = _queues[key] = [asyncio.Lock(), 0]
    queue[1] += 1
    try:
        async with queue[0]:
            yield
    finally:
        queue[1] -= 1
        if queue[1] == 0 and _queues.get(key) is queue:
            del _queues[key]


def recall(plan: LimitPlan, now: float | None = None) -> Decision | None:
    """The remembered refusal for this tenant, moved on to `now`; None: ask the limiter."""
    entry = _memo.get(plan.tenant_id)
    if entry is None:
        return None
    now = time.monotonic() if now is None else now
    if now >= entry.until or entry.limits != plan.limits:
        _memo.pop(plan.tenant_id, None)
        return None
    tpm = plan.limits.tokens_per_minute
    if tpm is not None and plan.tokens > tpm:
        return None  # the limiter's answer is `too_large`, which it checks before the request count
    d = entry.decision
    if d.reason in _SIZED and (plan.tokens < entry.tokens or plan.spend_nano < entry.spend_nano):
        return None  # a smaller request than the refused one may fit: the limiter decides
    elapsed = now - entry.asked_at
    tokens = _later(d.tokens, elapsed)
    if d.reason == "requests":
        retry_after = entry.until - now
    elif d.reason == "tokens" and tokens is not None and tpm:
        if tokens.remaining >= plan.tokens:
            return None  # refilled enough meanwhile: the limiter decides
        retry_after = (plan.tokens - tokens.remaining) * 60 / tpm  # the bucket's refill to this size
    elif d.reason in _SIZED:
        retry_after = max(0.0, d.retry_after - elapsed)  # the month's end, nearer
    else:
        retry_after = d.retry_after
    return replace(d, retry_after=retry_after, requests=_later(d.requests, elapsed), tokens=tokens)


def slot_freed(tenant_id: int) -> None:
    """A request of this tenant settled here: its slot is free and what it did not use is refunded, so a
    concurrency, tokens or budget refusal no longer holds (a requests one does: a settle gives no request back)."""
    entry = _memo.get(tenant_id)
    if entry is not None and entry.decision.reason != "requests":
        with _lock:
            if _memo.get(tenant_id) is entry:
                del _memo[tenant_id]


def _later(window: WindowState | None, elapsed: float) -> WindowState | None:
    """A token bucket's window `elapsed` seconds on: refilled at limit/60 a second, never over its limit."""
    if window is None:
        return None
    refilled = int(window.remaining + elapsed * window.limit / 60)
    return WindowState(window.limit, min(window.limit, refilled), max(0.0, window.reset_seconds - elapsed))
