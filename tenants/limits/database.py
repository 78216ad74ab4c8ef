"""The database limiter: the same algorithm as the Redis script, under a per-tenant row lock.

`SELECT ... FOR UPDATE` on the tenant's RateLimitState row serialises every decision for that
tenant across gateway processes (PostgreSQL); on SQLite, BEGIN IMMEDIATE serialises all writers.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.asyncdb import db_call

from ..models import BudgetPeriod, RateLimitState, Reservation
from . import refusals
from .base import (
    BudgetSeed,
    Decision,
    LimitPlan,
    Settlement,
    WindowState,
    period_start,
    seconds_to_next_period,
    to_nano,
)


def _refill(state: RateLimitState, rpm: int | None, tpm: int | None, now: float) -> tuple[float, float]:
    fresh = state.refilled_at == 0
    elapsed = max(0.0, now - state.refilled_at)
    r = float(rpm or 0) if fresh else state.request_allowance
    t = float(tpm or 0) if fresh else state.token_allowance
    if rpm is not None:
        r = min(rpm, r + elapsed * rpm / 60)
    if tpm is not None:
        t = min(tpm, t + elapsed * tpm / 60)
    return r, t


def _window(limit: int | None, left: float) -> WindowState | None:
    if limit is None:
        return None
    reset = max(0.0, limit - left) * 60 / limit if limit > 0 else 0.0
    return WindowState(limit, int(max(0.0, left)), reset)


def _locked_state(tenant_id: int) -> RateLimitState:
    # The row exists after a tenant's first decision: read (and lock) it first and create it only when
    # missing. Why: every statement lengthens the transaction, and on SQLite every other writer waits
    # for it (one INSERT-OR-IGNORE fewer per reservation and settlement).
    state = RateLimitState.objects.select_for_update().filter(tenant_id=tenant_id).first()
    if state is not None:
        return state
    RateLimitState.objects.bulk_create([RateLimitState(tenant_id=tenant_id)], ignore_conflicts=True)
    return RateLimitState.objects.select_for_update().get(tenant_id=tenant_id)


_STATE_FIELDS = ("request_allowance", "token_allowance", "refilled_at")

# Tenants refused here lately (monotonic time of the refusal): their next decisions are read first,
# without the lock, and only one that looks admissible takes it (`_peek`).
PEEK_SECONDS = 5.0
_MAX_REMEMBERED = 100_000  # tenants remembered per process; past that, forgotten at once
_refused_lately: dict[int, float] = {}

# When each tenant's expired reservations were last deleted here (monotonic). Expired rows no longer
# count (concurrency compares expires_at with the clock) and only a crashed request leaves one, so they
# are deleted at most once a SWEEP_SECONDS per tenant, not inside every reservation's transaction.
SWEEP_SECONDS = 1.0
_swept_at: dict[int, float] = {}


def _sweep_due(tenant_id: int) -> bool:
    now = time.monotonic()
    last = _swept_at.get(tenant_id)
    if last is not None and now - last < SWEEP_SECONDS:
        return False
    if len(_swept_at) >= _MAX_REMEMBERED:
        _swept_at.clear()
    _swept_at[tenant_id] = now
    return True


def _refused(plan: LimitPlan, reason: str, retry: float, r: float, t: float) -> Decision:
    lim = plan.limits
    return Decision(False, reason, retry, _window(lim.requests_per_minute, r), _window(lim.tokens_per_minute, t))


def _rate_refusal(plan: LimitPlan, r: float, t: float) -> Decision | None:
    """The request-size, requests- and tokens-per-minute checks, in that order, on buckets refilled to now."""
    rpm, tpm = plan.limits.requests_per_minute, plan.limits.tokens_per_minute
    if tpm is not None and plan.tokens > tpm:
        return _refused(plan, "too_large", 60.0, r, t)
    if rpm is not None and r < 1:
        return _refused(plan, "requests", (1 - r) * 60 / rpm if rpm else 60.0, r, t)
    if tpm is not None and t < plan.tokens:
        return _refused(plan, "tokens", (plan.tokens - t) * 60 / tpm if tpm else 60.0, r, t)
    return None


def _slots_full(plan: LimitPlan, wall: dt.datetime) -> bool:
    conc = plan.limits.max_concurrent_requests
    return conc is not None and Reservation.objects.filter(tenant_id=plan.tenant_id, expires_at__gt=wall).count() >= conc


def _budget_refusal(plan: LimitPlan, budget: BudgetPeriod) -> tuple[str | None, bool]:
    """(the budget refusal's reason or None, whether a soft budget is overrun)."""
    lim = plan.limits
    soft = False
    if lim.monthly_token_budget is not None and budget.tokens + plan.tokens > lim.monthly_token_budget:
        if lim.hard_budget:
            return "token_budget", False
        soft = True
    if lim.monthly_spend_budget is not None and budget.spend_nano + plan.spend_nano > to_nano(lim.monthly_spend_budget):
        if lim.hard_budget:
            return "spend_budget", False
        soft = True
    return None, soft


def _peek(plan: LimitPlan) -> Decision | None:
    """The refusal the locked decision would give, read without the lock (autocommit reads: no write
    transaction on SQLite, no row lock on PostgreSQL); None when the request looks admissible, or the
    tenant has no state or month counter yet: then the lock decides, checking everything again.

    Why: a flooding tenant's requests that the process memory cannot answer (a concurrency, tokens or
    budget refusal once its quarter second in memory is over, a too_large one) each took the write
    lock just to refuse, and on `make run`'s SQLite a paying tenant's reservation queued behind
    them (benchmarks.flood: most of the reservation's lock wait was other reservations). Refusing on a
    read is sound: every refusal is of something exhausted when it was read, and a limit only loosens
    through a settle or a refill, which the next read sees; the reads are separate statements, so the
    reason given is the first exhausted one in check order as each was read. Admitting always takes
    the lock, so nothing here can admit more than the limits allow."""
    state = RateLimitState.objects.filter(tenant_id=plan.tenant_id).first()
    if state is None:
        return None
    lim = plan.limits
    r, t = _refill(state, lim.requests_per_minute, lim.tokens_per_minute, time.time())
    if (refusal := _rate_refusal(plan, r, t)) is not None:
        return refusal
    wall = timezone.now()
    if _slots_full(plan, wall):
        return _refused(plan, "concurrency", 1.0, r, t)
    budget = BudgetPeriod.objects.filter(tenant_id=plan.tenant_id, period_start=period_start(wall)).first()
    if budget is None:
        return None
    reason, _ = _budget_refusal(plan, budget)
    return _refused(plan, reason, seconds_to_next_period(wall), r, t) if reason else None


def _reserve(plan: LimitPlan, seed: BudgetSeed | None) -> Decision | None:
    refused_at = _refused_lately.get(plan.tenant_id)
    if refused_at is not None and time.monotonic() - refused_at < PEEK_SECONDS:
        if (refusal := _peek(plan)) is not None:
            return refusal
    decision = _reserve_locked(plan, seed)
    if decision is not None and not decision.allowed:
        if len(_refused_lately) >= _MAX_REMEMBERED:
            _refused_lately.clear()
        _refused_lately[plan.tenant_id] = time.monotonic()
    return decision


def _reserve_locked(plan: LimitPlan, seed: BudgetSeed | None) -> Decision | None:
    lim = plan.limits
    rpm, tpm = lim.requests_per_minute, lim.tokens_per_minute
    with transaction.atomic():
        state = _locked_state(plan.tenant_id)
        now = time.time()
        r, t = _refill(state, rpm, tpm, now)
        if (refusal := _rate_refusal(plan, r, t)) is not None:
            return refusal
        wall = timezone.now()
        if _slots_full(plan, wall):
            return _refused(plan, "concurrency", 1.0, r, t)

        period = period_start(wall)
        budget = BudgetPeriod.objects.filter(tenant_id=plan.tenant_id, period_start=period).first()
        if budget is None:
            if seed is None:
                return None
            budget = BudgetPeriod.objects.create(
                tenant_id=plan.tenant_id, period_start=period, tokens=max(0, seed.tokens),
                spend_nano=max(0, seed.spend_nano),
            )
        reason, soft = _budget_refusal(plan, budget)
        if reason:
            return _refused(plan, reason, seconds_to_next_period(wall), r, t)

        if rpm is not None:
            r -= 1
        if tpm is not None:
            t -= plan.tokens
        state.request_allowance, state.token_allowance, state.refilled_at = r, t, now
        state.save(update_fields=_STATE_FIELDS)
        if _sweep_due(plan.tenant_id):
            Reservation.objects.filter(tenant_id=plan.tenant_id, expires_at__lte=wall).delete()
        Reservation.objects.create(
            request_id=plan.request_id,
            tenant_id=plan.tenant_id,
            tokens=plan.tokens,
            spend_nano=plan.spend_nano,
            period_start=period,
            expires_at=wall + timedelta(seconds=settings.TESSERA_RESERVATION_TTL_SECONDS),
        )
        BudgetPeriod.objects.filter(pk=budget.pk).update(
            tokens=F("tokens") + plan.tokens, spend_nano=F("spend_nano") + plan.spend_nano
        )
        return Decision(True, None, 0.0, _window(rpm, r), _window(tpm, t), soft)


def _settle(s: Settlement) -> bool:
    rpm, tpm = s.limits.requests_per_minute, s.limits.tokens_per_minute
    d_tok = s.actual_tokens - s.reserved_tokens
    d_sp = s.actual_spend_nano - s.reserved_spend_nano
    with transaction.atomic():
        state = _locked_state(s.tenant_id)
        deleted, _ = Reservation.objects.filter(request_id=s.request_id, tenant_id=s.tenant_id).delete()
        if not deleted:
            return False
        if tpm is not None and d_tok:
            now = time.time()
            r, t = _refill(state, rpm, tpm, now)
            state.request_allowance, state.token_allowance, state.refilled_at = r, min(tpm, t - d_tok), now
            state.save(update_fields=_STATE_FIELDS)
        BudgetPeriod.objects.filter(tenant_id=s.tenant_id, period_start=s.period).update(
            tokens=F("tokens") + d_tok, spend_nano=F("spend_nano") + d_sp
        )
        return True


RENEW_CHUNK = 500  # request ids per UPDATE (SQLite's parameter limit is far above; one statement stays short)


def _renew(held: Sequence[tuple[int, str]]) -> int:
    # No tenant lock: an UPDATE of rows that still exist never resurrects a settled (deleted) one, and
    # counting concurrency only compares expires_at with the clock.
    until = timezone.now() + timedelta(seconds=settings.TESSERA_RESERVATION_TTL_SECONDS)
    ids = [request_id for _, request_id in held]
    return sum(Reservation.objects.filter(request_id__in=ids[i:i + RENEW_CHUNK]).update(expires_at=until)
               for i in range(0, len(ids), RENEW_CHUNK))


def _usage(tenant_id: int, period: dt.date) -> tuple[int, int]:
    budget = BudgetPeriod.objects.filter(tenant_id=tenant_id, period_start=period).first()
    return (budget.tokens, budget.spend_nano) if budget else (0, 0)


class DatabaseLimiter:
    in_turn = True  # a tenant's decisions queue on its row lock (SQLite: on the one write lock)

    async def reserve(self, plan: LimitPlan, *, seed: BudgetSeed | None = None) -> Decision | None:
        return await db_call(_reserve, plan, seed)

    async def settle(self, settlement: Settlement) -> bool:
        settled = await db_call(_settle, settlement)
        refusals.slot_freed(settlement.tenant_id)  # its slot is free: a remembered concurrency refusal ends
        return settled

    async def renew(self, held: Sequence[tuple[int, str]]) -> int:
        return await db_call(_renew, held) if held else 0

    async def usage(self, *, tenant_id: int, period: dt.date) -> tuple[int, int]:
        return await db_call(_usage, tenant_id, period)

    def usage_sync(self, *, tenant_id: int, period: dt.date) -> tuple[int, int]:
        return _usage(tenant_id, period)
