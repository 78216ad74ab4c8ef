"""Both limiter backends against one contract: buckets, concurrency, budgets, settle once."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from decimal import Decimal

import pytest

from tenants.limits import BudgetSeed, LimitPlan, Settlement, period_start
from tenants.limits.base import to_nano
from tenants.selectors import TenantLimits

UNLIMITED = TenantLimits(
    tier="test", priority=5, requests_per_minute=None, tokens_per_minute=None, max_concurrent_requests=None,
    monthly_token_budget=None, monthly_spend_budget=None, hard_budget=True, slo_ttft_p95_ms=None,
    slo_itl_p95_ms=None,
)


# The database limiter runs its transactions on other threads, so it needs real commits; the Redis
# limiter never touches the database (tenant ids are just numbers to it).
@pytest.fixture(params=[pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
                        pytest.param("redis", marks=pytest.mark.redis)])
def limiter(request, settings, redis_url):
    if request.param == "redis":
        from tenants.limits.redis import RedisLimiter

        settings.TESSERA_REDIS_PREFIX = f"tsrtest-{uuid.uuid4().hex[:10]}"
        return AutoSeeded(RedisLimiter(redis_url))
    from tenants.limits.database import DatabaseLimiter

    return AutoSeeded(DatabaseLimiter())


class AutoSeeded:
    """The limiter as the gateway drives it: a missing month counter is created from a seed (here:
    nothing used yet). `.raw` is the limiter itself, for the tests of the seed protocol."""

    def __init__(self, raw) -> None:
        self.raw = raw

    async def reserve(self, p: LimitPlan, *, seed: BudgetSeed | None = None):
        decision = await self.raw.reserve(p, seed=seed)
        return decision if decision is not None or seed is not None else await self.raw.reserve(p, seed=BudgetSeed())

    def __getattr__(self, name):
        return getattr(self.raw, name)


@pytest.fixture
def tenant_id(request, limiter) -> int:
    from tenants.limits.redis import RedisLimiter

    if isinstance(limiter.raw, RedisLimiter):
        return 1_000_000 + uuid.uuid4().int % 1_000_000
    return request.getfixturevalue("make_tenant")().pk


def plan(tenant_id: int, limits: TenantLimits, tokens: int = 10, spend_nano: int = 0) -> LimitPlan:
    return LimitPlan(tenant_id, f"req_{uuid.uuid4().hex}", limits, tokens, spend_nano)


def settlement(p: LimitPlan, actual_tokens: int, actual_spend_nano: int = 0) -> Settlement:
    return Settlement(
        p.tenant_id, p.request_id, p.limits, period_start(), p.tokens, actual_tokens, p.spend_nano,
        actual_spend_nano,
    )


async def test_requests_per_minute_bucket(limiter, tenant_id):
    limits = replace(UNLIMITED, requests_per_minute=3)
    decisions = [await limiter.reserve(plan(tenant_id, limits)) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.requests.remaining for d in decisions[:3]] == [2, 1, 0]
    refused = decisions[3]
    assert refused.reason == "requests"
    assert 15 < refused.retry_after <= 20.5  # one request refills in 60/3 s
    assert refused.requests.limit == 3 and refused.tokens is None


async def test_tokens_per_minute_reserve_then_settle_refunds(limiter, tenant_id):
    limits = replace(UNLIMITED, tokens_per_minute=1000)
    first = plan(tenant_id, limits, tokens=600)
    assert (await limiter.reserve(first)).tokens.remaining == 400
    second = plan(tenant_id, limits, tokens=600)
    refused = await limiter.reserve(second)
    assert not refused.allowed and refused.reason == "tokens"
    assert await limiter.settle(settlement(first, actual_tokens=100))  # 500 of 600 come back
    admitted = await limiter.reserve(second)
    assert admitted.allowed and 290 <= admitted.tokens.remaining <= 310


async def test_request_larger_than_the_minute_is_refused(limiter, tenant_id):
    decision = await limiter.reserve(plan(tenant_id, replace(UNLIMITED, tokens_per_minute=100), tokens=101))
    assert not decision.allowed and decision.reason == "too_large"


async def test_concurrency_slots_return_on_settle(limiter, tenant_id):
    limits = replace(UNLIMITED, max_concurrent_requests=2)
    a, b, c = (plan(tenant_id, limits) for _ in range(3))
    assert (await limiter.reserve(a)).allowed and (await limiter.reserve(b)).allowed
    assert (await limiter.reserve(c)).reason == "concurrency"
    await limiter.settle(settlement(a, actual_tokens=0))
    assert (await limiter.reserve(c)).allowed


async def test_settle_applies_once(limiter, tenant_id):
    limits = replace(UNLIMITED, monthly_token_budget=10_000)
    p = plan(tenant_id, limits, tokens=500)
    await limiter.reserve(p, seed=BudgetSeed())
    assert await limiter.usage(tenant_id=tenant_id, period=period_start()) == (500, 0)
    assert await limiter.settle(settlement(p, actual_tokens=120)) is True
    assert await limiter.settle(settlement(p, actual_tokens=120)) is False
    assert await limiter.usage(tenant_id=tenant_id, period=period_start()) == (120, 0)


async def test_fifty_concurrent_against_a_budget_for_ten(limiter, tenant_id):
    limits = replace(UNLIMITED, monthly_token_budget=10 * 100)
    assert await limiter.raw.reserve(plan(tenant_id, limits, tokens=100)) is None  # no counter yet: asks for a seed
    decisions = await asyncio.gather(*(limiter.reserve(plan(tenant_id, limits, tokens=100), seed=BudgetSeed())
                                       for _ in range(50)))
    assert sum(d.allowed for d in decisions) == 10
    assert {d.reason for d in decisions if not d.allowed} == {"token_budget"}
    assert all(d.retry_after >= 1 for d in decisions if not d.allowed)
    assert await limiter.usage(tenant_id=tenant_id, period=period_start()) == (1000, 0)


async def test_soft_budget_admits_and_flags(limiter, tenant_id):
    limits = replace(UNLIMITED, monthly_token_budget=100, hard_budget=False)
    assert not (await limiter.reserve(plan(tenant_id, limits, tokens=100), seed=BudgetSeed())).over_soft_budget
    decision = await limiter.reserve(plan(tenant_id, limits, tokens=100))
    assert decision.allowed and decision.over_soft_budget


async def test_spend_budget_is_seeded_from_billing_then_enforced(limiter, tenant_id):
    limits = replace(UNLIMITED, monthly_spend_budget=Decimal("1.00"))
    p = plan(tenant_id, limits, spend_nano=to_nano(Decimal("0.30")))
    assert await limiter.raw.reserve(p) is None  # no counter this month: asks for the ledger's figure
    assert (await limiter.reserve(p, seed=BudgetSeed(tokens=7, spend_nano=to_nano(Decimal("0.50"))))).allowed
    refused = await limiter.reserve(plan(tenant_id, limits, spend_nano=to_nano(Decimal("0.30"))))
    assert not refused.allowed and refused.reason == "spend_budget"
    await limiter.settle(settlement(p, actual_tokens=5, actual_spend_nano=to_nano(Decimal("0.10"))))
    assert (await limiter.reserve(plan(tenant_id, limits, spend_nano=to_nano(Decimal("0.30"))))).allowed
    assert await limiter.usage(tenant_id=tenant_id, period=period_start()) == (22, to_nano(Decimal("0.90")))


async def test_a_lost_token_counter_is_seeded_from_what_was_used(limiter, tenant_id):
    """A Redis restart without persistence loses the month's counter: the limiter asks for a seed again
    (the ledger's tokens plus in-flight reservations), so a hard token budget stays hard."""
    assert await limiter.raw.reserve(plan(tenant_id, UNLIMITED, tokens=5)) is None  # any tenant: the counter is its usage
    limits = replace(UNLIMITED, monthly_token_budget=1000)
    assert await limiter.raw.reserve(plan(tenant_id, limits, tokens=100)) is None
    refused = await limiter.reserve(plan(tenant_id, limits, tokens=100), seed=BudgetSeed(tokens=950))
    assert not refused.allowed and refused.reason == "token_budget"
    assert (await limiter.raw.reserve(plan(tenant_id, limits, tokens=50))).allowed  # the counter exists now
    assert await limiter.usage(tenant_id=tenant_id, period=period_start()) == (1000, 0)


async def test_a_renewed_reservation_outlives_the_ttl_and_still_settles(limiter, tenant_id, settings):
    """A request that runs longer than the reservation TTL keeps its concurrency slot while it is
    renewed, and its settlement still applies (the month's counter ends at what it used)."""
    settings.TESSERA_RESERVATION_TTL_SECONDS = 1
    limits = replace(UNLIMITED, max_concurrent_requests=1, monthly_token_budget=10**6)
    long, other = plan(tenant_id, limits, tokens=500), plan(tenant_id, limits, tokens=10)
    assert (await limiter.reserve(long)).allowed
    for _ in range(8):  # 2.4 s: over twice the TTL
        await asyncio.sleep(0.3)
        assert await limiter.renew([(tenant_id, long.request_id)]) == 1
    assert (await limiter.reserve(other)).reason == "concurrency"
    assert await limiter.settle(settlement(long, actual_tokens=120)) is True
    assert await limiter.usage(tenant_id=tenant_id, period=period_start()) == (120, 0)
    assert await limiter.renew([(tenant_id, long.request_id)]) == 0  # settled: never renewed back to life
    assert (await limiter.reserve(other)).allowed


async def test_an_unrenewed_reservation_still_expires(limiter, tenant_id, settings):
    """A dead gateway renews nothing: its slots come back after the TTL, as before."""
    settings.TESSERA_RESERVATION_TTL_SECONDS = 1
    limits = replace(UNLIMITED, max_concurrent_requests=1)
    assert (await limiter.reserve(plan(tenant_id, limits))).allowed
    assert (await limiter.reserve(plan(tenant_id, limits))).reason == "concurrency"
    await asyncio.sleep(1.3)
    assert (await limiter.reserve(plan(tenant_id, limits))).allowed
