"""The database limiter refuses a tenant refused lately by reading first, without the lock
(tenants/limits/database.py `_peek`): the same answer as the locked decision, no writer queued behind
it, and never an admission the limits do not allow."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from decimal import Decimal

import pytest
from django.db import transaction

from tenants.limits import BudgetSeed, LimitPlan, Settlement, period_start
from tenants.limits import database as db_limiter
from tenants.selectors import TenantLimits
from tests.db_threads import in_thread

pytestmark = pytest.mark.django_db(transaction=True)

UNLIMITED = TenantLimits(
    tier="test", priority=5, requests_per_minute=None, tokens_per_minute=None, max_concurrent_requests=None,
    monthly_token_budget=None, monthly_spend_budget=None, hard_budget=True, slo_ttft_p95_ms=None,
    slo_itl_p95_ms=None,
)


@pytest.fixture(autouse=True)
def _forget_refusals():
    db_limiter._refused_lately.clear()  # SQLite reuses the ids of a flushed table's rows
    yield
    db_limiter._refused_lately.clear()


def plan(tenant_id: int, limits: TenantLimits, tokens: int = 10, spend_nano: int = 0) -> LimitPlan:
    return LimitPlan(tenant_id, f"req_{uuid.uuid4().hex}", limits, tokens, spend_nano)


def reserve(p: LimitPlan):
    return db_limiter._reserve(p, BudgetSeed())


# Each case: limits, the plan's tokens and spend, and how many admissions exhaust it first.
CASES = {
    "requests": (replace(UNLIMITED, requests_per_minute=2), 10, 0, 2),
    "tokens": (replace(UNLIMITED, tokens_per_minute=100), 40, 0, 2),
    "concurrency": (replace(UNLIMITED, max_concurrent_requests=2), 10, 0, 2),
    "token_budget": (replace(UNLIMITED, monthly_token_budget=25), 10, 0, 2),
    "spend_budget": (replace(UNLIMITED, monthly_spend_budget=Decimal("0.000002")), 10, 1000, 2),
}


@pytest.mark.parametrize("reason", sorted(CASES))
def test_the_read_refusal_is_the_locked_one(make_tenant, reason):
    limits, tokens, spend, admitted = CASES[reason]
    tenant = make_tenant().pk
    assert all(reserve(plan(tenant, limits, tokens, spend)).allowed for _ in range(admitted))
    p = plan(tenant, limits, tokens, spend)
    read = db_limiter._peek(p)
    locked = db_limiter._reserve_locked(p, None)
    assert read is not None and not read.allowed and read.reason == reason
    assert read.reason == locked.reason
    assert [(w.limit, w.remaining) for w in (read.requests, read.tokens) if w] == \
        [(w.limit, w.remaining) for w in (locked.requests, locked.tokens) if w]
    assert read.retry_after == pytest.approx(locked.retry_after, abs=0.5)


def test_too_large_is_refused_by_the_read_too(make_tenant):
    tenant = make_tenant().pk
    limits = replace(UNLIMITED, tokens_per_minute=100)
    assert reserve(plan(tenant, limits)).allowed  # the tenant has a state row
    refusal = db_limiter._peek(plan(tenant, limits, tokens=101))
    assert refusal is not None and refusal.reason == "too_large"


def test_an_admissible_request_is_left_to_the_lock(make_tenant):
    tenant = make_tenant().pk
    limits = replace(UNLIMITED, max_concurrent_requests=2, requests_per_minute=100, monthly_token_budget=1000)
    assert db_limiter._peek(plan(tenant, limits)) is None  # no state yet
    first = plan(tenant, limits)
    assert reserve(first).allowed
    assert db_limiter._peek(plan(tenant, limits)) is None  # a slot, requests and budget left
    assert reserve(plan(tenant, limits)).allowed
    assert db_limiter._peek(plan(tenant, limits)).reason == "concurrency"
    db_limiter._settle(Settlement(tenant, first.request_id, limits, period_start(), first.tokens, 0, 0, 0))
    assert db_limiter._peek(plan(tenant, limits)) is None  # the freed slot is read at once


def test_a_refused_tenant_is_refused_while_another_holds_the_lock(make_tenant):
    """The attack: a writer sits on the lock (SQLite: the write lock; PostgreSQL: the tenant's row
    lock). A tenant refused lately is refused all the same, without waiting for it."""
    tenant = make_tenant().pk
    limits = replace(UNLIMITED, max_concurrent_requests=1)
    assert reserve(plan(tenant, limits)).allowed
    assert reserve(plan(tenant, limits)).reason == "concurrency"  # refused lately from here on
    holding, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            db_limiter._locked_state(tenant)
            holding.set()
            release.wait(30)

    holder, _ = in_thread(hold)
    try:
        assert holding.wait(10)
        asker, out = in_thread(reserve, plan(tenant, limits))
        asker.join(3)  # the lock path would wait for the holder (30 s here)
        assert not asker.is_alive(), "the refusal waited for the lock"
        assert "error" not in out and out["value"].reason == "concurrency"
    finally:
        release.set()
        holder.join(30)


def test_a_tenant_not_refused_lately_is_not_read_first(make_tenant, monkeypatch):
    """Admissions pay nothing for the read path: a tenant never refused goes straight to the lock."""
    tenant = make_tenant().pk
    limits = replace(UNLIMITED, max_concurrent_requests=4)
    assert reserve(plan(tenant, limits)).allowed
    peeked = []
    original = db_limiter._peek
    monkeypatch.setattr(db_limiter, "_peek", lambda p: peeked.append(p) or original(p))
    assert reserve(plan(tenant, limits)).allowed
    assert peeked == []
    for _ in range(2):
        reserve(plan(tenant, limits))
    assert reserve(plan(tenant, limits)).reason == "concurrency"
    assert len(peeked) == 0  # the refusal came from the lock; the next one reads first
    assert reserve(plan(tenant, limits)).reason == "concurrency"
    assert len(peeked) == 1


def test_racing_threads_never_admit_past_the_limit(make_tenant):
    """64 requests race for the last two slots of a tenant refused lately: two are admitted."""
    tenant = make_tenant().pk
    limits = replace(UNLIMITED, max_concurrent_requests=4)
    held = [plan(tenant, limits) for _ in range(3)]
    assert all(reserve(p).allowed for p in held)
    db_limiter._refused_lately[tenant] = time.monotonic()  # as if refused a moment ago
    db_limiter._settle(Settlement(tenant, held[0].request_id, limits, period_start(), 10, 0, 0, 0))
    threads = [in_thread(reserve, plan(tenant, limits)) for _ in range(64)]
    for t, _ in threads:
        t.join(60)
    decisions = [out["value"] for _, out in threads]
    assert sum(d.allowed for d in decisions) == 2
    assert {d.reason for d in decisions if not d.allowed} == {"concurrency"}
