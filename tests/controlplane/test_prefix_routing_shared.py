"""Several gateways, one routing table: two in-process registries (each with its own local table, as
two gateway processes have) sharing Redis. A prefix routed through one routes the next turn through
the other to the same worker; another tenant's identical prompt gets nothing; Redis holds salted
hashes and nothing else, within its bounds; while Redis is killed or hung, routing goes on from the
local table within the short timeout, and sharing resumes when Redis is back."""

from __future__ import annotations

import logging
import re
import time
import uuid

import orjson
import pytest
import redis
from django.test import AsyncClient

from controlplane.gateway.routing import shared_prefixes
from controlplane.gateway.routing.prefix_routing import prefix_key, prompt_text
from controlplane.gateway.routing.workers import ModelTarget, Registry
from tests.throwaway_services import throwaway_redis  # noqa: F401 (fixture, by request.getfixturevalue)

pytestmark = pytest.mark.redis

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
SYSTEM = "You are the support assistant of a bicycle shop; answer briefly and politely. " * 20


def chat(*turns: str) -> str:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return prompt_text("chat", {"messages": messages})


TURN1 = chat("Where is my order?")
TURN2 = chat("Where is my order?", "It shipped on Monday.", "When will it arrive?")
TURN3 = chat("Where is my order?", "It shipped on Monday.", "When will it arrive?", "Thursday.", "Thanks!")


@pytest.fixture
def shared(settings, redis_url):
    """Sharing on, in a namespace of this test's own on the suite's Redis (removed afterwards)."""
    settings.TESSERA_ROUTING_SHARED = True
    settings.REDIS_URL = redis_url
    settings.TESSERA_REDIS_PREFIX = f"tsrtest-{uuid.uuid4().hex[:10]}"
    settings.TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS = 0.05
    settings.TESSERA_ROUTING_SHARED_RETRY_SECONDS = 0.3
    namespace = settings.TESSERA_REDIS_PREFIX
    yield settings
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)
    client.close()


def gateway(settings, *, share: bool = True) -> Registry:
    """A gateway process's registry: its own local table, all workers ready."""
    settings.TESSERA_ROUTING_SHARED = share
    registry = Registry(URLS)
    settings.TESSERA_ROUTING_SHARED = True
    for worker in registry.workers:
        worker.ready, worker.models = True, {"m": ModelTarget("m", "m", None)}
    return registry


async def route(registry: Registry, salt: str, text: str) -> str:
    """What the proxy does per request: one shared lookup, then pick (which records)."""
    key = prefix_key(text, salt, "m")
    shared = await registry.shared_matches("m", key)
    return registry.pick("m", b"", prefix=key, shared=shared).url


def fresh_choice(settings, salt: str, text: str) -> str:
    """Where a gateway that has seen nothing would send it (local table only, empty)."""
    return gateway(settings, share=False).pick("m", b"", prefix=prefix_key(text, salt, "m")).url


async def route_elsewhere(registry: Registry, salt: str, text: str, avoid: str) -> str:
    """Route through `registry` to a worker other than `avoid` (the others look busy): the test then
    knows the next turn can only find it there through the shared table."""
    target = next(u for u in URLS if u != avoid)
    for worker in registry.workers:
        worker.outstanding = 0 if worker.url == target else 1
    assert await route(registry, salt, text) == target
    for worker in registry.workers:
        worker.outstanding = 0
    await registry.shared.drain()
    return target


async def test_a_prefix_routed_by_one_gateway_routes_the_next_turn_through_another(shared) -> None:
    a, b = gateway(shared), gateway(shared)
    unseen = fresh_choice(shared, "salt-alice", TURN2)
    target = await route_elsewhere(a, "salt-alice", TURN1, avoid=unseen)
    # B never routed Alice: without the shared table it would send her next turn to `unseen`.
    assert await route(b, "salt-alice", TURN2) == target
    await b.shared.drain()
    assert await route(a, "salt-alice", TURN3) == target
    # B recorded TURN2's deeper chunks for every gateway: A's lookup sees them.
    key3 = prefix_key(TURN3, "salt-alice", "m")
    matched = await a.shared_matches("m", key3)
    assert matched[target] == len(prefix_key(TURN2, "salt-alice", "m").chunks)
    assert [matched[u] for u in URLS if u != target] == [0, 0]


async def test_another_tenants_identical_prompt_does_not_get_the_hit(shared) -> None:
    a, b = gateway(shared), gateway(shared)
    await route_elsewhere(a, "salt-alice", TURN1, avoid=fresh_choice(shared, "salt-alice", TURN2))
    assert await b.shared_matches("m", prefix_key(TURN2, "salt-bob", "m")) == dict.fromkeys(URLS, 0)
    assert await route(b, "salt-bob", TURN2) == fresh_choice(shared, "salt-bob", TURN2)


async def test_redis_holds_salted_chunk_hashes_only_within_bounds(shared) -> None:
    shared.TESSERA_ROUTING_CACHE_CHUNKS = 12
    a = gateway(shared)
    workers, hashes = set(), set()
    for i, text in enumerate([TURN1, TURN2, TURN3, chat("Do you sell helmets?") * 3]):
        salt = f"salt-{i % 2}"
        workers.add(await route(a, salt, text))
        hashes.update(prefix_key(text, salt, "m").chunks)
    await a.shared.drain()
    client = redis.Redis.from_url(shared.REDIS_URL)
    keys = list(client.scan_iter(f"{shared.TESSERA_REDIS_PREFIX}:*"))
    assert keys and len(keys) == len(workers)  # one sorted set per worker routed to
    words = {w.encode() for w in re.findall(r"[A-Za-z]{4,}", SYSTEM + "Where order shipped helmets")}
    for name in keys:
        assert re.fullmatch(rf"{shared.TESSERA_REDIS_PREFIX}:rt:[0-9a-f]{{16}}".encode(), name)  # no URL, no tenant
        assert client.type(name) == b"zset"
        assert 0 < client.pttl(name) <= 3600 * 1000
        members = client.zrange(name, 0, -1)
        assert 0 < len(members) <= 12  # capped like the local table
        assert set(members) <= hashes  # nothing but the requests' salted chunk hashes
        assert not any(word in m for m in members for word in words)
    client.close()


def unreachable_warnings(caplog) -> int:
    return sum("shared routing table unreachable" in r.getMessage() for r in caplog.records)


async def test_routing_goes_on_while_redis_is_away_and_sharing_resumes(shared, request, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tessera.gateway")
    server = request.getfixturevalue("throwaway_redis")
    shared.REDIS_URL = server.url
    a, b = gateway(shared), gateway(shared)
    target = await route_elsewhere(a, "salt-alice", TURN1, avoid=fresh_choice(shared, "salt-alice", TURN2))
    assert await route(b, "salt-alice", TURN2) == target
    await b.shared.drain()
    local_only = shared_prefixes.LOCAL_ONLY._value.get()

    # Hung (SIGSTOP: connections accepted by the kernel, never answered): the request that finds out
    # waits the 50 ms timeout, the next ones do not ask at all.
    server.pause()
    try:
        started = time.perf_counter()
        assert await route(a, "salt-alice", TURN3) == target  # A's own table
        assert time.perf_counter() - started < 0.5
        started = time.perf_counter()
        await route(b, "salt-dave", TURN1)  # B finds out too
        assert time.perf_counter() - started < 0.5
        for _ in range(20):
            started = time.perf_counter()
            await route(b, f"salt-{uuid.uuid4().hex}", TURN1)
            assert time.perf_counter() - started < 0.02
        assert not a.shared.up and not b.shared.up
        assert shared_prefixes.SHARED_UP._value.get() == 0
        assert shared_prefixes.LOCAL_ONLY._value.get() >= local_only + 22
    finally:
        server.resume()
    assert unreachable_warnings(caplog) == 2  # once per gateway, not per request

    # Killed (connection refused), then started again empty on the same port.
    server.stop()
    time.sleep(0.35)  # past the retry interval: the next request tries Redis once
    started = time.perf_counter()
    assert await route(b, "salt-alice", TURN3) == target  # B routed TURN2 there itself
    assert time.perf_counter() - started < 0.5
    server.start()
    time.sleep(0.35)
    bob_unseen = fresh_choice(shared, "salt-bob", TURN2)
    await route(a, "salt-carol", TURN1)  # the first request after the interval finds Redis back
    assert a.shared.up
    bob = await route_elsewhere(a, "salt-bob", TURN1, avoid=bob_unseen)
    assert await route(b, "salt-bob", TURN2) == bob  # shared again
    assert b.shared.up and shared_prefixes.SHARED_UP._value.get() == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)


async def send(workers, secret: str, text: str) -> tuple[int, int, float]:
    """One chat request through the whole gateway: (status, index of the worker that got it, seconds)."""
    before = [len(w.received) for w in workers]
    body = {"model": "fake-model", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
            "max_tokens": 2}
    started = time.perf_counter()
    response = await AsyncClient().post("/v1/chat/completions", data=orjson.dumps(body), content_type="application/json",
                                        headers={"Authorization": f"Bearer {secret}"})
    elapsed = time.perf_counter() - started
    got = [i for i, w in enumerate(workers) if len(w.received) > before[i]]
    return response.status_code, got[0] if got else -1, elapsed


@pytest.mark.django_db(transaction=True)
async def test_the_gateway_answers_every_request_while_redis_is_killed(gateway, tenant_key, workers, drain,
                                                                      request) -> None:
    """The real request path (auth, database limiter, proxy): Redis killed under it costs no request."""
    from controlplane.gateway.routing import workers as registry_module

    server = request.getfixturevalue("throwaway_redis")
    gateway.TESSERA_ROUTING_POLICY = "cache_aware"
    gateway.TESSERA_ROUTING_SHARED = True
    gateway.REDIS_URL = server.url
    gateway.TESSERA_REDIS_PREFIX = f"tsrtest-{uuid.uuid4().hex[:10]}"
    gateway.TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS = 0.05
    gateway.TESSERA_ROUTING_SHARED_RETRY_SECONDS = 0.3
    registry_module._registry = None
    _, secret = await tenant_key()
    status, first, _ = await send(workers, secret, "Where is my order?")
    assert status == 200
    registry = registry_module.get_registry()
    assert registry.shared is not None and registry.shared.up

    server.stop()
    answered = [await send(workers, secret, f"Question {i}: where is my order?") for i in range(12)]
    assert [status for status, _, _ in answered] == [200] * 12
    assert {worker for _, worker, _ in answered} == {first}  # the system prompt's prefix, from the local table
    assert max(seconds for _, _, seconds in answered) < 1.0
    assert not registry.shared.up

    server.start()
    time.sleep(0.35)  # past the retry interval
    status, worker, _ = await send(workers, secret, "And my refund?")
    assert (status, worker) == (200, first)
    assert registry.shared.up
    await registry.shared.drain()
    await drain()
