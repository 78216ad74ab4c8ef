"""Failed API-key authentications per client address, counted where the tenants' limits are.

A token bucket per address: capacity TESSERA_AUTH_FAILURES_PER_MINUTE, refilled at that many per
minute. Each failure takes one; a failure that finds less than one left is refused (the caller
answers 429 instead of 401) and takes nothing, so an address may fail that many times in a burst
and that many times a minute after it, never more. Only failures are ever sent here: a request with
a valid key costs this store nothing.

The backend follows TESSERA_LIMITER, like the tenants' limits: one Lua script call on Redis (key
`<prefix>:af:<address>`, expiring once the bucket would be full again), or one row lock on the
database (tenants.AuthFailureWindow). Both answer a sync caller (the management API, DRF) and an
async one (the gateway).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache

import redis as sync_redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import transaction

from common.asyncdb import db_call

from ..models import AuthFailureWindow

# KEYS[1] the bucket; ARGV[1] the limit per minute. Replies {allowed (1/0), retry-after in ms}.
FAIL = """
local limit = tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'a', 'ts')
local a = tonumber(b[1]) or limit
local ts = tonumber(b[2]) or now
a = math.min(limit, a + math.max(0, now - ts) * limit / 60)
if a < 1 then return {0, math.ceil((1 - a) * 60000 / limit)} end
a = a - 1
redis.call('HSET', KEYS[1], 'a', a, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((limit - a) * 60000 / limit) + 1000)
return {1, 0}
"""

STALE_SECONDS = 600  # a database row idle this long is a full bucket: deleted now and then
_PRUNE_ONE_IN = 256  # failures between prunes of stale rows, on average


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool  # False: this failure is over the limit (answer 429)
    retry_after: float = 0.0  # seconds until the address may fail once more


def per_minute() -> int:
    """The limit; 0 or less turns the throttle off."""
    return int(settings.TESSERA_AUTH_FAILURES_PER_MINUTE)


def _bucket_key(address: str) -> str:
    return f"{settings.TESSERA_REDIS_PREFIX}:af:{address}"


class RedisAuthFailures:
    def __init__(self, url: str) -> None:
        self.url = url
        self._async: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # redis.asyncio: one client per loop
        self._sync = None
        self._lock = threading.Lock()

    def _timeouts(self) -> dict:
        timeout = settings.TESSERA_REDIS_TIMEOUT_SECONDS
        return {"socket_connect_timeout": timeout, "socket_timeout": timeout}

    @staticmethod
    def _verdict(out) -> Verdict:
        return Verdict(bool(int(out[0])), int(out[1]) / 1000)

    async def fail(self, address: str, limit: int) -> Verdict:
        loop = asyncio.get_running_loop()
        script = self._async.get(loop)
        if script is None:
            client = aioredis.from_url(self.url, max_connections=64, **self._timeouts())
            script = self._async[loop] = client.register_script(FAIL)
        return self._verdict(await script(keys=[_bucket_key(address)], args=[limit]))

    def fail_sync(self, address: str, limit: int) -> Verdict:
        with self._lock:
            if self._sync is None:
                self._sync = sync_redis.Redis.from_url(self.url, **self._timeouts()).register_script(FAIL)
        return self._verdict(self._sync(keys=[_bucket_key(address)], args=[limit]))


def _fail_in_database(address: str, limit: int) -> Verdict:
    with transaction.atomic():
        AuthFailureWindow.objects.bulk_create([AuthFailureWindow(address=address, allowance=limit, refilled_at=time.time())],
                                              ignore_conflicts=True)
        row = AuthFailureWindow.objects.select_for_update().get(address=address)
        now = time.time()
        allowance = min(limit, row.allowance + max(0.0, now - row.refilled_at) * limit / 60)
        if allowance < 1:
            return Verdict(False, math.ceil((1 - allowance) * 60000 / limit) / 1000)
        row.allowance, row.refilled_at = allowance - 1, now
        row.save(update_fields=["allowance", "refilled_at"])
        if random.randrange(_PRUNE_ONE_IN) == 0:  # noqa: S311  (not security: spreads the pruning)
            AuthFailureWindow.objects.filter(refilled_at__lt=now - STALE_SECONDS).delete()
        return Verdict(True)


class DatabaseAuthFailures:
    async def fail(self, address: str, limit: int) -> Verdict:
        return await db_call(_fail_in_database, address, limit)

    def fail_sync(self, address: str, limit: int) -> Verdict:
        return _fail_in_database(address, limit)


@lru_cache(maxsize=1)
def _store(kind: str, redis_url: str):
    if kind == "redis":
        if not redis_url:
            raise ValueError("The Redis limiter needs REDIS_URL")
        return RedisAuthFailures(redis_url)
    if kind == "database":
        return DatabaseAuthFailures()
    raise ValueError(f"TESSERA_LIMITER must be 'redis' or 'database', not {kind!r}")


def get_store() -> RedisAuthFailures | DatabaseAuthFailures:
    return _store(settings.TESSERA_LIMITER, settings.REDIS_URL)


def reset_store() -> None:
    _store.cache_clear()
