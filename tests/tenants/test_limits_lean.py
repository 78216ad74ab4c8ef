"""A database reservation does only the statements its decision needs (tenants/limits/database.py):
the tenant's state row is created once, not tried again in every transaction, and expired reservations
are deleted at most once a second per tenant, not inside every reservation. Why: on SQLite every other
writer (a paying tenant's reservation among them) waits for each of these transactions."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.asyncdb import db_call
from tenants.limits import BudgetSeed, LimitPlan, Settlement, period_start
from tenants.limits import database as db_limiter
from tenants.models import RateLimitState, Reservation
from tenants.selectors import TenantLimits

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = TenantLimits(
    tier="test", priority=5, requests_per_minute=100, tokens_per_minute=10_000, max_concurrent_requests=1,
    monthly_token_budget=None, monthly_spend_budget=None, hard_budget=True, slo_ttft_p95_ms=None,
    slo_itl_p95_ms=None,
)


@pytest.fixture(autouse=True)
def _forget():
    # SQLite reuses the ids of a flushed table's rows: nothing remembered may outlive a test
    db_limiter._refused_lately.clear()
    db_limiter._swept_at.clear()
    yield
    db_limiter._refused_lately.clear()
    db_limiter._swept_at.clear()


def plan(tenant_id: int, limits: TenantLimits = LIMITS) -> LimitPlan:
    return LimitPlan(tenant_id, f"req_{uuid.uuid4().hex}", limits, 10, 0)


def reserve(p: LimitPlan):
    return db_limiter._reserve(p, BudgetSeed())


def settle(p: LimitPlan) -> bool:
    return db_limiter._settle(Settlement(p.tenant_id, p.request_id, p.limits, period_start(timezone.now()),
                                         p.tokens, p.tokens, p.spend_nano, p.spend_nano))


def expired(tenant_id: int) -> Reservation:
    return Reservation.objects.create(request_id=f"crashed_{uuid.uuid4().hex}", tenant_id=tenant_id, tokens=10,
                                      period_start=period_start(timezone.now()),
                                      expires_at=timezone.now() - timedelta(seconds=5))


def statements(fn) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        fn()
    return [q["sql"].upper() for q in queries.captured_queries]


def test_a_known_tenants_reservation_and_settlement_create_no_state_and_delete_nothing_expired(make_tenant):
    tenant = make_tenant().pk
    first = plan(tenant)
    assert reserve(first).allowed and RateLimitState.objects.filter(tenant_id=tenant).exists()
    assert settle(first)
    again = plan(tenant)
    sql = statements(lambda: reserve(again))
    state_table = RateLimitState._meta.db_table.upper()
    assert not [s for s in sql if s.startswith("INSERT") and state_table in s], sql
    assert not [s for s in sql if s.startswith("DELETE")], sql
    assert Reservation.objects.filter(request_id=again.request_id).exists()
    sql = statements(lambda: settle(again))
    assert not [s for s in sql if s.startswith("INSERT")], sql
    assert not Reservation.objects.filter(tenant_id=tenant).exists()


def test_a_new_tenants_first_decision_still_creates_its_state(make_tenant):
    tenant = make_tenant().pk
    assert not RateLimitState.objects.filter(tenant_id=tenant).exists()
    assert reserve(plan(tenant)).allowed
    state = RateLimitState.objects.get(tenant_id=tenant)
    assert state.request_allowance == pytest.approx(99, abs=0.1)


def test_an_expired_reservation_never_counts_and_is_deleted_once_the_sweep_is_due(make_tenant):
    tenant = make_tenant().pk
    first = plan(tenant)
    assert reserve(first).allowed and settle(first)  # swept just now
    crashed = expired(tenant)
    # within the second: left in place, and it does not take the one concurrent slot
    p = plan(tenant)
    assert reserve(p).allowed
    assert Reservation.objects.filter(pk=crashed.pk).exists()
    assert settle(p)
    # the sweep is due: the next reservation deletes it
    db_limiter._swept_at[tenant] = time.monotonic() - db_limiter.SWEEP_SECONDS - 0.1
    assert reserve(plan(tenant)).allowed
    assert not Reservation.objects.filter(pk=crashed.pk).exists()


def test_a_sweep_is_per_tenant(make_tenant):
    a, b = make_tenant().pk, make_tenant().pk
    assert reserve(plan(a)).allowed  # a swept
    crashed = expired(b)
    assert reserve(plan(b)).allowed  # b's first: its sweep is due, whatever a did
    assert not Reservation.objects.filter(pk=crashed.pk).exists()


@pytest.fixture
def new_tenant(make_tenant) -> int:
    return make_tenant().pk


async def test_a_new_tenants_first_decisions_racing_create_one_state_and_admit_exactly_the_limit(new_tenant):
    """No state row yet and 16 first requests at once (the gateway's database threads, PostgreSQL's row
    locks): each finds no row, tries to create it, and one creation wins; the limit still holds exactly."""
    limits = replace(LIMITS, requests_per_minute=None, tokens_per_minute=None, max_concurrent_requests=4)
    limiter = db_limiter.DatabaseLimiter()
    decisions = await asyncio.gather(*(limiter.reserve(plan(new_tenant, limits), seed=BudgetSeed())
                                       for _ in range(16)))
    assert sum(d.allowed for d in decisions) == 4
    assert {d.reason for d in decisions if not d.allowed} == {"concurrency"}

    def rows() -> tuple[int, int]:
        return (RateLimitState.objects.filter(tenant_id=new_tenant).count(),
                Reservation.objects.filter(tenant_id=new_tenant).count())

    assert await db_call(rows) == (1, 4)
