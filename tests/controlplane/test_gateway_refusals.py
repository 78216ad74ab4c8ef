"""A tenant over its requests per minute is refused cheaply: after the limiter's first refusal, its
requests are answered from this process's memory (no database query, no limiter call, no worker),
with the same OpenAI error and rate-limit headers, until its bucket can hold a request again. Driven
through the deployed ASGI application, so the /v1 handler's early answer is what is tested."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from django.db.backends.utils import CursorWrapper

from tenants.limits import Decision, LimitPlan, WindowState, refusals

from .asgi_driver import call

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()


@pytest.fixture
def counted(monkeypatch):
    """Counts of database queries (any thread, any connection) and limiter reservations."""
    from tenants.limits import get_limiter

    counts = {"queries": 0, "reserves": 0}
    execute = CursorWrapper._execute_with_wrappers

    def counting_execute(self, *args, **kwargs):
        counts["queries"] += 1
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(CursorWrapper, "_execute_with_wrappers", counting_execute)
    limiter = get_limiter()
    reserve = limiter.reserve

    async def counting_reserve(*args, **kwargs):
        counts["reserves"] += 1
        return await reserve(*args, **kwargs)

    monkeypatch.setattr(limiter, "reserve", counting_reserve)
    return counts


@pytest.mark.parametrize("backend", ["database", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_refused_tenant_costs_no_query_no_limiter_call_and_no_worker(backend, request, gateway, tenant_key,
                                                                               workers, drain):
    if backend == "redis":
        request.getfixturevalue("use_redis_limiter")
    gateway.TESSERA_AUTH_CACHE_SECONDS = 60.0  # the key from the process cache, as in production
    from controlplane.asgi import application

    _, secret = await tenant_key(requests_per_minute=1)
    headers = {"authorization": f"Bearer {secret}"}
    admitted = await call(application, "/v1/chat/completions", [CHAT], headers=headers)
    first = await call(application, "/v1/chat/completions", [CHAT], headers=headers)  # the limiter refuses
    assert (admitted.status, first.status) == (200, 429)
    await drain()
    served = sum(len(w.received) for w in workers)
    counted = request.getfixturevalue("counted")

    again = [await call(application, "/v1/chat/completions", [CHAT], headers=headers) for _ in range(5)]

    assert [r.status for r in again] == [429] * 5
    assert counted == {"queries": 0, "reserves": 0}
    assert sum(len(w.received) for w in workers) == served  # no worker saw them
    for reply in again:  # the same answer as the limiter's own refusal
        assert reply.json()["error"] == {**first.json()["error"], "message": reply.json()["error"]["message"]}
        assert reply.json()["error"]["message"].startswith("Rate limit reached for requests per min (RPM)")
        for name in ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests"):
            assert reply.headers[name] == first.headers[name]
        assert 1 <= int(reply.headers["retry-after"]) <= int(first.headers["retry-after"])
        assert int(reply.headers["retry-after-ms"]) <= int(first.headers["retry-after-ms"])
        assert reply.headers["x-ratelimit-reset-requests"].endswith("s") and "x-request-id" in reply.headers
    # Answers decided before the limits stay as they were: a bad body, an unknown model.
    bad = await call(application, "/v1/chat/completions", [b"{not json"], headers=headers)
    unknown = await call(application, "/v1/chat/completions", [CHAT.replace(b"fake-model", b"no-such-model")],
                         headers=headers)
    assert (bad.status, bad.json()["error"]["code"]) == (400, "invalid_json")
    assert (unknown.status, unknown.json()["error"]["code"]) == (404, "model_not_found")


@pytest.mark.parametrize("backend", ["database", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_tenant_past_its_hard_token_budget_is_refused_from_memory_unless_a_smaller_request_may_fit(
        backend, request, gateway, tenant_key, workers, drain):
    """Every refusal reason as cheap as the requests-per-minute one: a flood past a hard monthly token
    budget asks the limiter once, then is refused from memory (no query, no limiter call, no worker)
    for requests at least as large; a smaller one is asked, since it may fit."""
    if backend == "redis":
        request.getfixturevalue("use_redis_limiter")
    gateway.TESSERA_AUTH_CACHE_SECONDS = 60.0
    from controlplane.asgi import application

    _, secret = await tenant_key(requests_per_minute=10_000, monthly_token_budget=40, budget_enforcement="hard")
    headers = {"authorization": f"Bearer {secret}"}
    first = await call(application, "/v1/chat/completions", [CHAT], headers=headers)  # the limiter refuses
    assert first.status == 429 and first.json()["error"]["code"] == "insufficient_quota", first.json()
    counted = request.getfixturevalue("counted")
    again = [await call(application, "/v1/chat/completions", [CHAT], headers=headers) for _ in range(5)]
    assert [r.status for r in again] == [429] * 5
    assert counted == {"queries": 0, "reserves": 0}
    assert not any(w.received for w in workers)
    for reply in again:
        assert reply.json()["error"] == {**first.json()["error"], "message": reply.json()["error"]["message"]}
        assert 1 <= int(reply.headers["retry-after"]) <= int(first.headers["retry-after"])
    smaller = CHAT.replace(b'"max_tokens": 4', b'"max_tokens": 1')
    assert (await call(application, "/v1/chat/completions", [smaller], headers=headers)).status in (200, 429)
    assert counted["reserves"] == 1  # a smaller request may fit: asked
    await drain()
    refusals.clear()


def _plan(tokens: int = 10, **limits) -> LimitPlan:
    from tenants.limits import TenantLimits

    fields = {"tier": "free", "priority": 30, "requests_per_minute": 2, "tokens_per_minute": 1000,
              "max_concurrent_requests": None, "monthly_token_budget": None, "monthly_spend_budget": None,
              "hard_budget": False, "slo_ttft_p95_ms": None, "slo_itl_p95_ms": None, **limits}
    return LimitPlan(7, "req_x", TenantLimits(**fields), tokens, 0)


def _refused(reason: str = "requests", retry: float = 20.0) -> Decision:
    return Decision(False, reason, retry, WindowState(2, 0, 50.0), WindowState(1000, 400, 36.0))


def test_a_requests_refusal_is_remembered_until_the_bucket_refills():
    refusals.clear()
    plan = _plan()
    refusals.remember(plan, _refused("too_large", 60.0), asked_at=100.0)
    assert refusals.recall(plan, now=100.1) is None  # never remembered: the limiter says it from the limits
    refusals.remember(plan, _refused(), asked_at=100.0)
    later = refusals.recall(plan, now=106.0)
    assert later.reason == "requests" and later.retry_after == pytest.approx(14.0)
    assert later.requests == WindowState(2, 0, 44.0)  # still no request in the bucket
    assert later.tokens == WindowState(1000, 500, 30.0)  # refilled at 1000/60 a second for 6 s
    assert refusals.recall(_plan(tokens=2000), now=106.0) is None  # too large: the limiter says so first
    assert refusals.recall(_plan(requests_per_minute=60), now=106.0) is None  # limits changed: ask again
    refusals.remember(plan, _refused(), asked_at=100.0)
    assert refusals.recall(plan, now=120.0) is None  # the bucket holds a request again
    refusals.clear()


def test_tokens_and_budget_refusals_hold_briefly_for_requests_at_least_as_large():
    refusals.clear()
    big = _plan(tokens=700)
    refusals.remember(big, Decision(False, "tokens", 18.0, WindowState(2, 1, 30.0), WindowState(1000, 400, 36.0)),
                      asked_at=100.0)
    held = refusals.recall(_plan(tokens=800), now=100.12)
    assert held.reason == "tokens" and held.tokens.remaining == 402  # 400 + 0.12 s × 1000/60
    assert held.retry_after == pytest.approx((800 - 402) * 60 / 1000)  # the refill to this request's size
    assert refusals.recall(_plan(tokens=500), now=100.1) is None  # smaller: it may fit, the limiter decides
    assert refusals.recall(big, now=100.0 + refusals.CONCURRENCY_MEMORY_SECONDS) is None  # a settle elsewhere may refund
    refusals.remember(big, Decision(False, "tokens", 0.12, None, WindowState(1000, 698, 1.0)), asked_at=100.0)
    assert refusals.recall(big, now=100.2) is None  # refilled to its size meanwhile
    for reason in ("token_budget", "spend_budget"):
        priced = LimitPlan(7, "req_x", big.limits, 700, 5_000)
        refusals.remember(priced, _refused(reason, retry=86_400.0), asked_at=100.0)
        later = refusals.recall(LimitPlan(7, "req_y", big.limits, 700, 5_000), now=100.2)
        assert later.reason == reason and later.retry_after == pytest.approx(86_399.8)  # the month's end, nearer
        assert refusals.recall(LimitPlan(7, "req_y", big.limits, 700, 4_000), now=100.1) is None  # cheaper
        assert refusals.recall(LimitPlan(7, "req_y", big.limits, 600, 5_000), now=100.1) is None  # fewer tokens
        refusals.slot_freed(7)  # a request of the tenant settled here: what it did not use is refunded
        assert refusals.recall(priced, now=100.1) is None
    refusals.clear()


def test_a_concurrency_refusal_is_held_a_quarter_second_or_until_a_slot_frees_here():
    refusals.clear()
    plan = _plan(max_concurrent_requests=2)
    refusals.remember(plan, _refused("concurrency", retry=1.0), asked_at=100.0)
    held = refusals.recall(plan, now=100.2)
    assert held.reason == "concurrency" and held.retry_after == 1.0  # the limiter's Retry-After, not the memory's
    assert refusals.recall(plan, now=100.0 + refusals.CONCURRENCY_MEMORY_SECONDS) is None  # another gateway may have freed one
    refusals.remember(plan, _refused("concurrency", retry=1.0), asked_at=100.0)
    refusals.slot_freed(plan.tenant_id)  # one of its requests settled here
    assert refusals.recall(plan, now=100.1) is None
    refusals.remember(plan, _refused(), asked_at=100.0)  # a requests refusal: a settle gives no request back
    refusals.slot_freed(plan.tenant_id)
    assert refusals.recall(plan, now=106.0).reason == "requests"
    refusals.clear()


async def test_a_flood_past_the_concurrency_limit_asks_the_limiter_once_and_a_settled_slot_admits_at_once(
        request, gateway, tenant_key, workers, drain, monkeypatch):
    """The free tier's refusal under benchmarks.flood's flood: concurrency, not requests per minute."""
    gateway.TESSERA_AUTH_CACHE_SECONDS = 60.0
    monkeypatch.setattr(refusals, "CONCURRENCY_MEMORY_SECONDS", 30.0)  # only the settle can end it here
    from controlplane.asgi import application

    for worker in workers:
        worker.token_delay = 0.1  # the admitted request holds its slot 0.4 s
    _, secret = await tenant_key(requests_per_minute=10_000, max_concurrent_requests=1)
    headers = {"authorization": f"Bearer {secret}"}
    holder = asyncio.create_task(call(application, "/v1/chat/completions", [CHAT], headers=headers))
    await asyncio.sleep(0.15)
    first = await call(application, "/v1/chat/completions", [CHAT], headers=headers)  # the limiter refuses
    assert first.status == 429 and first.json()["error"]["message"].startswith("Too many concurrent requests"), first.json()
    counted = request.getfixturevalue("counted")
    again = [await call(application, "/v1/chat/completions", [CHAT], headers=headers) for _ in range(5)]
    assert [r.status for r in again] == [429] * 5
    assert counted["reserves"] == 0 and counted["queries"] == 0  # from memory
    assert all(r.headers["retry-after"] == first.headers["retry-after"] for r in again)
    assert (await holder).status == 200
    await drain()  # its settle frees the slot here: the memory ends with it
    assert (await call(application, "/v1/chat/completions", [CHAT], headers=headers)).status == 200
    assert counted["reserves"] == 1
    refusals.clear()


async def test_when_a_concurrency_refusal_ends_the_flood_asks_the_limiter_one_at_a_time(
        request, gateway, tenant_key, workers, drain, monkeypatch):
    """The herd at the end of a remembered refusal: 24 of the tenant's requests in flight when it expires.
    Without taking turns each went to the limiter (on SQLite a write transaction each, a paying tenant's
    reservation queued behind them); in turn, the first is refused again and the rest from memory. Another
    tenant's reservations never wait in that line."""
    gateway.TESSERA_AUTH_CACHE_SECONDS = 60.0
    from controlplane.asgi import application
    from tenants.limits import get_limiter

    for worker in workers:
        worker.token_delay = 0.4  # the admitted request holds its slot 1.6 s
    _, secret = await tenant_key(requests_per_minute=10_000, max_concurrent_requests=1)
    _, other = await tenant_key(requests_per_minute=10_000)
    headers = {"authorization": f"Bearer {secret}"}
    holder = asyncio.create_task(call(application, "/v1/chat/completions", [CHAT], headers=headers))
    for _ in range(200):  # until the worker has it: its slot is taken
        if any(w.received for w in workers):
            break
        await asyncio.sleep(0.01)
    assert (await call(application, "/v1/chat/completions", [CHAT], headers=headers)).status == 429  # remembered
    await asyncio.sleep(refusals.CONCURRENCY_MEMORY_SECONDS + 0.05)  # ... and expired, the slot still held
    limiter = get_limiter()
    reserve = limiter.reserve
    in_flight = {"now": 0, "most": 0, "calls": 0}

    async def slow_reserve(*args, **kwargs):  # a limiter round trip that takes a while, as under load
        in_flight["now"] += 1
        in_flight["calls"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            await asyncio.sleep(0.05)
            return await reserve(*args, **kwargs)
        finally:
            in_flight["now"] -= 1

    monkeypatch.setattr(limiter, "reserve", slow_reserve)
    herd = await asyncio.gather(*(call(application, "/v1/chat/completions", [CHAT], headers=headers)
                                  for _ in range(24)))
    assert [r.status for r in herd] == [429] * 24
    assert in_flight["calls"] == 1 and in_flight["most"] == 1  # one asked; 23 answered from its refusal
    # Another tenant is not in that line: while one of the flooding tenant's requests asks, the other
    # tenant's reach the limiter beside it, in a line of their own (this limiter serialises each
    # tenant's decisions on its row anyway, so every tenant asks in turn: never three at once).
    await asyncio.sleep(refusals.CONCURRENCY_MEMORY_SECONDS + 0.05)  # the refusal has expired again
    in_flight.update(calls=0, most=0)
    asking = asyncio.create_task(call(application, "/v1/chat/completions", [CHAT], headers=headers))
    others = await asyncio.gather(*(call(application, "/v1/chat/completions", [CHAT],
                                         headers={"authorization": f"Bearer {other}"}) for _ in range(3)))
    assert [r.status for r in others] == [200] * 3 and (await asking).status == 429
    assert in_flight["calls"] == 5 and in_flight["most"] == 2  # (the other tenant's first asks twice: no month counter yet)
    assert (await holder).status == 200
    await drain()
    refusals.clear()


@pytest.mark.parametrize("backend", ["database", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_new_tenants_first_burst_seeds_its_month_once_and_asks_in_turn(
        backend, request, gateway, tenant_key, workers, drain, monkeypatch):
    """A new tenant's first 24 requests at once, none refused yet and no month counter: each used to
    reach the limiter (and, finding no counter, to sum the ledger for a seed) side by side, taking all
    of the gateway's database threads for the flood's first ~80 ms (benchmarks.flood); every other
    tenant's reservation queued behind them. The seed is summed once; on the database limiter the
    tenant's decisions go one at a time (they queue on its row anyway), so its burst holds one thread."""
    if backend == "redis":
        request.getfixturevalue("use_redis_limiter")
    gateway.TESSERA_AUTH_CACHE_SECONDS = 60.0
    import threading

    from controlplane.asgi import application
    from controlplane.gateway.usage import accounting
    from tenants.limits import database

    for worker in workers:
        worker.token_delay = 0.2  # the admitted request holds its slot while the rest arrive
    _, secret = await tenant_key(requests_per_minute=10_000, max_concurrent_requests=1)
    counts = {"seeds": 0, "now": 0, "most": 0}
    guard = threading.Lock()
    seed, reserve = accounting._budget_seed, database._reserve

    def counted_seed(*args):
        with guard:
            counts["seeds"] += 1
        time.sleep(0.05)  # the ledger's sums take a while on a real month
        return seed(*args)

    def counted_reserve(*args):
        with guard:
            counts["now"] += 1
            counts["most"] = max(counts["most"], counts["now"])
        try:
            time.sleep(0.01)
            return reserve(*args)
        finally:
            with guard:
                counts["now"] -= 1

    monkeypatch.setattr(accounting, "_budget_seed", counted_seed)
    monkeypatch.setattr(database, "_reserve", counted_reserve)
    burst = await asyncio.gather(*(call(application, "/v1/chat/completions", [CHAT],
                                        headers={"authorization": f"Bearer {secret}"}) for _ in range(24)))
    assert sorted(r.status for r in burst) == [200] + [429] * 23
    assert counts["seeds"] == 1
    if backend == "database":
        assert counts["most"] == 1  # one of the tenant's decisions at a time: one thread of the executor
    await drain()
    refusals.clear()


async def test_a_burst_on_a_key_not_in_the_cache_looks_it_up_once(gateway, tenant_key, workers, drain, monkeypatch):
    """48 requests at once with a key this process has not cached (a flood's first second; and, under
    load, every time the cached entry expires): each used to run the same key lookup on the gateway's
    database threads, and another tenant's reservation waited behind them. One lookup serves the burst;
    a revoked key's burst is refused as one, too."""
    gateway.TESSERA_AUTH_CACHE_SECONDS = 60.0
    import threading

    from asgiref.sync import sync_to_async

    from controlplane.asgi import application
    from tenants import auth, services
    from tenants.models import APIKey

    for worker in workers:
        worker.token_delay = 0.05
    tenant, secret = await tenant_key(requests_per_minute=1)
    lookups = {"n": 0}
    guard = threading.Lock()
    lookup = auth.lookup_hash

    def counted_lookup(key_hash):
        with guard:
            lookups["n"] += 1
        time.sleep(0.05)  # a lookup under load: the burst arrives while it runs
        return lookup(key_hash)

    monkeypatch.setattr(auth, "lookup_hash", counted_lookup)
    burst = await asyncio.gather(*(call(application, "/v1/chat/completions", [CHAT],
                                        headers={"authorization": f"Bearer {secret}"}) for _ in range(48)))
    assert sorted(r.status for r in burst) == [200] + [429] * 47
    assert lookups["n"] == 1
    await drain()

    key = await APIKey.objects.aget(tenant=tenant)
    await sync_to_async(services.api_key_revoke)(tenant=tenant, key=key)
    auth.cache_clear()
    refused = await asyncio.gather(*(call(application, "/v1/chat/completions", [CHAT],
                                          headers={"authorization": f"Bearer {secret}"}) for _ in range(16)))
    assert {r.status for r in refused} == {401}
    assert lookups["n"] == 2
    refusals.clear()


async def test_a_request_that_leaves_while_waiting_its_turn_frees_the_line():
    """A client that disconnects while its request waits behind the one asking the limiter: the line
    goes on without it and is forgotten once empty. A tenant not refused lately never makes one."""
    refusals.clear()
    async with refusals.one_at_a_time(7):
        pass
    assert not refusals._queues  # never refused: no line at all
    refusals.remember(_plan(), _refused("concurrency", 1.0), asked_at=time.monotonic())
    asking, release = asyncio.Event(), asyncio.Event()

    async def ahead():
        async with refusals.one_at_a_time(7):
            asking.set()
            await release.wait()

    first = asyncio.create_task(ahead())
    await asking.wait()
    waiting = asyncio.create_task(refusals.one_at_a_time(7).__aenter__())
    await asyncio.sleep(0.01)
    assert not waiting.done()  # in line behind the first
    waiting.cancel()  # its client left
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await first
    assert not refusals._queues  # nobody left in line: forgotten
    async with asyncio.timeout(1):  # and the next one is not held by the one that left
        async with refusals.one_at_a_time(7):
            pass
    refusals.clear()
