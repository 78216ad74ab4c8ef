"""Shared types of the limiters (the choice of backend is in factory.py).

Algorithm (both backends):
- requests/min and tokens/min are token buckets (capacity = the limit, refilled continuously at
  limit/60 per second); a request takes 1 request and `tokens` = prompt estimate + max completion.
- concurrency counts admitted, unsettled requests (each expires after the reservation TTL so a
  crashed gateway cannot leak a slot forever). A gateway renews the reservations of the requests it
  is still serving (`renew`, controlplane/gateway/usage/renewal.py), so a request that outlives the TTL (a
  long stream) keeps its slot, and its settlement still finds the reservation to apply to.
- monthly token and spend budgets are counters per calendar month (UTC) that include in-flight
  reservations: a request is admitted under a hard budget only if used + reserved + its estimate fits.
- the month's counter is created from a seed (`BudgetSeed`: the ledger's tokens and spend this month
  plus the reservations of requests still in flight, from the usage journal): on a tenant's first
  request of a month, and again after a Redis restart without persistence lost it, so a hard budget
  stays hard across the restart and the month's usage the API reports stays right.
- settle(actual) applies actual - reserved once (keyed by request id): refunds the token bucket and
  the monthly counters, or charges the excess. Release on failure is settle with actual = 0.
Everything a decision reads and writes for one tenant happens atomically in one place.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's effective limits: its tier's, with the tenant's overrides applied. None = unlimited."""

    tier: str  # tier name
    priority: int  # scheduler priority handed to workers (lower runs first)
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_concurrent_requests: int | None
    monthly_token_budget: int | None
    monthly_spend_budget: Decimal | None
    hard_budget: bool  # refuse when a monthly budget is exhausted (else serve and flag)
    slo_ttft_p95_ms: int | None
    slo_itl_p95_ms: int | None
    slo_availability_pct: Decimal | None = None
    fair_share_weight: int = 1  # the tier's share among tenants of one priority, handed to workers


NANO = Decimal("1e9")  # spend is tracked in integer billionths of the currency unit


def to_nano(amount: Decimal | None) -> int:
    return 0 if amount is None else int((Decimal(amount) * NANO).to_integral_value())


def from_nano(value: int) -> Decimal:
    return (Decimal(value) / NANO).quantize(Decimal("0.000000001"))


def period_start(at: dt.datetime | None = None) -> dt.date:
    at = at or dt.datetime.now(dt.UTC)
    return dt.date(at.year, at.month, 1)


def seconds_to_next_period(at: dt.datetime | None = None) -> float:
    at = at or dt.datetime.now(dt.UTC)
    first = period_start(at)
    nxt = dt.datetime(first.year + first.month // 12, first.month % 12 + 1, 1, tzinfo=dt.UTC)
    return max(1.0, (nxt - at).total_seconds())


@dataclass(frozen=True, slots=True)
class LimitPlan:
    tenant_id: int
    request_id: str
    limits: TenantLimits
    tokens: int  # prompt estimate + max completion tokens (x n)
    spend_nano: int  # price estimate of `tokens`; 0 when no spend budget applies


@dataclass(frozen=True, slots=True)
class BudgetSeed:
    """What this month has already used: the ledger's rows plus the in-flight reservations."""

    tokens: int = 0
    spend_nano: int = 0


@dataclass(frozen=True, slots=True)
class WindowState:
    limit: int
    remaining: int
    reset_seconds: float  # until the bucket is full again


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str | None = None  # requests | tokens | too_large | concurrency | token_budget | spend_budget
    retry_after: float = 0.0  # seconds
    requests: WindowState | None = None
    tokens: WindowState | None = None
    over_soft_budget: bool = False  # admitted although a soft budget is exhausted


@dataclass(frozen=True, slots=True)
class Settlement:
    tenant_id: int
    request_id: str
    limits: TenantLimits
    period: dt.date  # the month the reservation was charged to
    reserved_tokens: int
    actual_tokens: int
    reserved_spend_nano: int
    actual_spend_nano: int


class Limiter(Protocol):
    # Whether this limiter's decisions for one tenant are serialised anyway (a row lock): the gateway
    # then asks it one request of a tenant at a time (refusals.one_at_a_time), so one tenant's burst
    # waits on an asyncio lock instead of holding every thread of the database executor.
    in_turn: bool

    async def reserve(self, plan: LimitPlan, *, seed: BudgetSeed | None = None) -> Decision | None:
        """Admit or refuse. None means: this month has no counter for the tenant (yet, or any more); call
        again with `seed` (what the ledger and the journal say was used)."""

    async def settle(self, settlement: Settlement) -> bool:
        """Apply actual - reserved; True the first time for a request id, False after."""

    async def renew(self, held: Sequence[tuple[int, str]]) -> int:
        """Push the expiry of these (tenant id, request id) reservations to the TTL from now; one that
        was settled (or has already expired and been dropped) stays gone. The number renewed."""

    async def usage(self, *, tenant_id: int, period: dt.date) -> tuple[int, int]:
        """(tokens, spend_nano) charged to the period so far, reservations included."""

    def usage_sync(self, *, tenant_id: int, period: dt.date) -> tuple[int, int]:
        """The same, for sync callers (the management API)."""


def limit_or_unlimited(value: int | None) -> int:
    return -1 if value is None else int(value)

