"""The failed-authentication store on both limiter backends (tenants/limits/auth_failures.py), and the
throttle's policy around it (tenants/auth_throttle.py) with a stand-in authenticator."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from common.errors import ApplicationError
from tenants import auth, auth_throttle
from tenants.limits import auth_failures


@pytest.fixture(params=[pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
                        pytest.param("redis", marks=pytest.mark.redis)])
def store(request, settings, redis_url):
    settings.TESSERA_LIMITER = request.param
    settings.REDIS_URL = redis_url
    settings.TESSERA_REDIS_PREFIX = f"tsrtest-{uuid.uuid4().hex[:10]}"
    settings.TESSERA_AUTH_FAILURES_PER_MINUTE = 20
    auth_failures.reset_store()
    auth_throttle.clear()
    yield auth_failures.get_store()
    auth_failures.reset_store()
    auth_throttle.clear()


def address() -> str:
    return f"198.51.100.{uuid.uuid4().int % 250 + 1}-{uuid.uuid4().hex[:6]}"  # unique per test run


async def test_a_burst_of_twenty_then_refused_with_the_time_to_one_more(store):
    who = address()
    verdicts = [await store.fail(who, 20) for _ in range(21)]
    assert [v.allowed for v in verdicts] == [True] * 20 + [False]
    assert 2.0 < verdicts[-1].retry_after <= 3.0  # one failure back every 60/20 s
    assert (await store.fail(address(), 20)).allowed  # another address has its own bucket


async def test_concurrent_failures_are_counted_atomically(store):
    who = address()
    verdicts = await asyncio.gather(*(store.fail(who, 20) for _ in range(60)))
    assert sum(v.allowed for v in verdicts) == 20


async def test_the_bucket_refills_continuously(store):
    who = address()
    assert all([(await store.fail(who, 60)).allowed for _ in range(60)])
    # The bucket refills one failure a second: on a loaded machine the burst itself may take over a
    # second, so keep failing until refused rather than expect the 61st to be.
    for _ in range(10):
        refused = await store.fail(who, 60)
        if not refused.allowed:
            break
    assert not refused.allowed and refused.retry_after <= 1.0
    await asyncio.sleep(refused.retry_after + 0.1)
    assert (await store.fail(who, 60)).allowed
    started = time.monotonic()
    again = await store.fail(who, 60)
    if time.monotonic() - started < 0.5:  # no second has passed: the refill was used
        assert not again.allowed


def test_the_sync_door_shares_the_count(store, transactional_db):
    who = address()
    assert all(store.fail_sync(who, 20).allowed for _ in range(10))
    assert all(asyncio.run(_fail_many(store, who, 10)))
    refused = store.fail_sync(who, 20)
    assert not refused.allowed and refused.retry_after > 2.0


async def _fail_many(store, who, n):
    return [(await store.fail(who, 20)).allowed for _ in range(n)]


@pytest.mark.redis
async def test_the_redis_bucket_expires_once_it_would_be_full(settings, redis_url):
    import redis.asyncio as aioredis

    settings.REDIS_URL, settings.TESSERA_REDIS_PREFIX = redis_url, f"tsrtest-{uuid.uuid4().hex[:10]}"
    store = auth_failures.RedisAuthFailures(redis_url)
    who = address()
    for _ in range(5):
        await store.fail(who, 20)
    client = aioredis.from_url(settings.REDIS_URL)
    ttl = await client.pttl(auth_failures._bucket_key(who))
    await client.aclose()
    assert 14_000 < ttl <= 16_000  # 5 failures come back in 15 s (+1 s of slack); nothing is kept forever


def test_idle_database_rows_are_pruned(settings, transactional_db, monkeypatch):
    from tenants.models import AuthFailureWindow

    settings.TESSERA_LIMITER = "database"
    AuthFailureWindow.objects.create(address="203.0.113.9", allowance=3, refilled_at=time.time() - 3600)
    AuthFailureWindow.objects.create(address="203.0.113.10", allowance=3, refilled_at=time.time() - 10)
    monkeypatch.setattr(auth_failures, "_PRUNE_ONE_IN", 1)
    assert auth_failures.DatabaseAuthFailures().fail_sync("203.0.113.11", 20).allowed
    assert set(AuthFailureWindow.objects.values_list("address", flat=True)) == {"203.0.113.10", "203.0.113.11"}


@pytest.mark.parametrize(("given", "counted"), [
    ("192.0.2.7", "192.0.2.7"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("", "unknown"),
    (None, "unknown"),
])
def test_what_an_address_is_counted_under(given, counted):
    assert auth_throttle.address_key(given) == counted


def _bad(authorization):
    raise auth.invalid_key()


async def test_rotating_ipv6_addresses_within_a_64_does_not_escape(store):
    statuses = []
    for i in range(21):
        try:
            await auth_throttle.guarded(f"2001:db8:7:7::{i + 1:x}", "Bearer sk-made-up-made-up-made-up", _async(_bad))
        except ApplicationError as exc:
            statuses.append(exc.status)
    assert statuses == [401] * 20 + [429]


def _async(fn):
    async def call(authorization, **kwargs):
        return fn(authorization)

    return call


async def test_a_valid_key_never_reaches_the_store(store, monkeypatch):
    """The success path costs no store call: with the store made to fail loudly, valid keys still pass."""

    async def exploding(*args, **kwargs):
        raise AssertionError("the store was called for a valid key")

    monkeypatch.setattr(type(store), "fail", exploding)
    principal = object()
    for _ in range(50):
        assert await auth_throttle.guarded("192.0.2.50", "Bearer sk-good-good-good-good-good", _async(lambda h: principal)) is principal


async def test_the_store_unreachable_fails_open(settings, monkeypatch):
    """Redis gone: failures are not counted and stay 401s; nothing turns into a 5xx."""
    settings.TESSERA_LIMITER, settings.REDIS_URL = "redis", "redis://127.0.0.1:9/0"  # nothing listens on port 9
    settings.TESSERA_REDIS_TIMEOUT_SECONDS = 0.5
    settings.TESSERA_AUTH_FAILURES_PER_MINUTE = 2
    auth_failures.reset_store()
    auth_throttle.clear()
    try:
        for _ in range(5):
            with pytest.raises(ApplicationError) as caught:
                await auth_throttle.guarded("192.0.2.60", "Bearer sk-made-up-made-up-made-up", _async(_bad))
            assert caught.value.status == 401
        with pytest.raises(ApplicationError) as caught:
            auth_throttle.guarded_sync("192.0.2.60", "Bearer sk-made-up-made-up-made-up", _bad)
        assert caught.value.status == 401
    finally:
        auth_failures.reset_store()


async def test_turned_off_it_never_refuses(store, settings):
    settings.TESSERA_AUTH_FAILURES_PER_MINUTE = 0
    for _ in range(30):
        with pytest.raises(ApplicationError) as caught:
            await auth_throttle.guarded("192.0.2.70", None, _async(_bad))
        assert caught.value.status == 401
