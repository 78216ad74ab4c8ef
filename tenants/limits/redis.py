"""The Redis limiter: each reserve and settle is one Lua script, so it is atomic across gateways.

Keys per tenant share the hash tag {t:<id>} (cluster-safe):
  tsr:{t:ID}:b       hash  r (request allowance), t (token allowance), ts (last refill, Redis TIME)
  tsr:{t:ID}:inf     zset  in-flight request ids, scored by expiry (concurrency)
  tsr:{t:ID}:m:YYYYMM hash tok, sp (this month's tokens and spend in nano units, reservations included);
                     created from a BudgetSeed when missing (a new month, or a Redis restart lost it)
  tsr:{t:ID}:r:RID   string, the reservation marker: settle applies only if it deletes this key
"""

from __future__ import annotations

import asyncio
import datetime as dt
import weakref
from collections import defaultdict
from collections.abc import Sequence

import redis as sync_redis
import redis.asyncio as aioredis
from django.conf import settings

from . import refusals
from .base import (
    BudgetSeed,
    Decision,
    LimitPlan,
    Settlement,
    WindowState,
    limit_or_unlimited,
    period_start,
    seconds_to_next_period,
    to_nano,
)

# Lua numbers become integers in replies, so times go out as integer milliseconds.
_REFILL = """
local function refill(b, rpm, tpm, now)
  local ts = tonumber(b[3]) or now
  local elapsed = math.max(0, now - ts)
  local r = tonumber(b[1]) or rpm
  local t = tonumber(b[2]) or tpm
  if rpm >= 0 then r = math.min(rpm, r + elapsed * rpm / 60) end
  if tpm >= 0 then t = math.min(tpm, t + elapsed * tpm / 60) end
  return r, t
end
local function reset_ms(value, cap)
  if cap <= 0 then return 0 end
  return math.floor(math.max(0, cap - value) * 60000 / cap)
end
"""

RESERVE = _REFILL + """
local rid = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tok_budget, sp_budget, hard = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local need_tok, need_sp = tonumber(ARGV[8]), tonumber(ARGV[9])
local resv_ttl, seed, period_ttl = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local tok_seed = tonumber(ARGV[13])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local r, t = refill(redis.call('HMGET', KEYS[1], 'r', 't', 'ts'), rpm, tpm, now)

local function answer(code, retry_ms, soft, r_left, t_left)
  return {code, math.ceil(retry_ms), math.floor(math.max(0, r_left)), reset_ms(r_left, rpm),
          math.floor(math.max(0, t_left)), reset_ms(t_left, tpm), soft}
end
if tpm >= 0 and need_tok > tpm then return answer(6, 60000, 0, r, t) end
if rpm >= 0 and r < 1 then return answer(1, (1 - r) * 60000 / rpm, 0, r, t) end
if tpm >= 0 and t < need_tok then return answer(2, (need_tok - t) * 60000 / tpm, 0, r, t) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if conc >= 0 and redis.call('ZCARD', KEYS[2]) >= conc then return answer(3, 1000, 0, r, t) end

local soft = 0
if redis.call('EXISTS', KEYS[3]) == 0 then
  if seed < 0 then return {-1} end
  redis.call('HSET', KEYS[3], 'tok', math.max(tok_seed, 0), 'sp', math.max(seed, 0))
  redis.call('EXPIRE', KEYS[3], period_ttl)
end
local used = redis.call('HMGET', KEYS[3], 'tok', 'sp')
if tok_budget >= 0 and tonumber(used[1]) + need_tok > tok_budget then
  if hard then return answer(4, 0, 0, r, t) end
  soft = 1
end
if sp_budget >= 0 and tonumber(used[2]) + need_sp > sp_budget then
  if hard then return answer(5, 0, 0, r, t) end
  soft = 1
end

if rpm >= 0 then r = r - 1 end
if tpm >= 0 then t = t - need_tok end
redis.call('HSET', KEYS[1], 'r', r, 't', t, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 120000)
redis.call('ZADD', KEYS[2], now + resv_ttl, rid)
redis.call('EXPIRE', KEYS[2], resv_ttl)
redis.call('HINCRBY', KEYS[3], 'tok', need_tok)
redis.call('HINCRBY', KEYS[3], 'sp', need_sp)
redis.call('SET', KEYS[4], '1', 'EX', resv_ttl)
return answer(0, 0, soft, r, t)
"""

SETTLE = _REFILL + """
if redis.call('DEL', KEYS[4]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local d_tok, d_sp = tonumber(ARGV[4]), tonumber(ARGV[5])
if tpm >= 0 and d_tok ~= 0 then
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
  local r, t = refill(redis.call('HMGET', KEYS[1], 'r', 't', 'ts'), rpm, tpm, now)
  t = math.min(tpm, t - d_tok)
  redis.call('HSET', KEYS[1], 'r', r, 't', t, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'tok', d_tok)
  redis.call('HINCRBY', KEYS[3], 'sp', d_sp)
end
return 1
"""

# KEYS[1] the in-flight zset, KEYS[2..] the reservation markers; ARGV[1] the TTL, ARGV[2..] the request ids.
# Only a reservation whose marker still exists is renewed (a settled one stays settled); the zset's own
# expiry, which each reserve sets to the TTL, is pushed out too, or the set would vanish under a long stream.
RENEW = """
local ttl = tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local renewed = 0
for i = 2, #KEYS do
  if redis.call('EXPIRE', KEYS[i], ttl) == 1 then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 and redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
return renewed
"""

_REASONS = {1: "requests", 2: "tokens", 3: "concurrency", 4: "token_budget", 5: "spend_budget", 6: "too_large"}
PERIOD_TTL = 40 * 86400


def _keys(tenant_id: int, request_id: str, period: dt.date) -> list[str]:
    base = f"{settings.TESSERA_REDIS_PREFIX}:{{t:{tenant_id}}}"
    return [f"{base}:b", f"{base}:inf", f"{base}:m:{period:%Y%m}", f"{base}:r:{request_id}"]


class RedisLimiter:
    in_turn = False  # one atomic script a decision, no lock held: a tenant's requests may ask at once

    def __init__(self, url: str) -> None:
        if not url:
            raise ValueError("The Redis limiter needs REDIS_URL")
        self.url = url
        # redis.asyncio connections belong to one event loop: one client per loop.
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def client(self) -> aioredis.Redis:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            # Bounded waits: a Redis that hangs (a partition, a failover) must fail the request fast (a
            # 503 at the gateway), not hold it and its client until the OS gives up on the socket.
            timeout = settings.TESSERA_REDIS_TIMEOUT_SECONDS
            client = aioredis.from_url(self.url, max_connections=256, socket_connect_timeout=timeout,
                                       socket_timeout=timeout)
            entry = (client, client.register_script(RESERVE), client.register_script(SETTLE),
                     client.register_script(RENEW))
            self._clients[loop] = entry
        return entry[0]

    def _scripts(self):
        self.client()
        return self._clients[asyncio.get_running_loop()]

    async def reserve(self, plan: LimitPlan, *, seed: BudgetSeed | None = None) -> Decision | None:
        lim = plan.limits
        _, reserve, _, _ = self._scripts()
        period = period_start()
        rpm = limit_or_unlimited(lim.requests_per_minute)
        tpm = limit_or_unlimited(lim.tokens_per_minute)
        args = [
            plan.request_id,
            rpm,
            tpm,
            limit_or_unlimited(lim.max_concurrent_requests),
            limit_or_unlimited(lim.monthly_token_budget),
            -1 if lim.monthly_spend_budget is None else to_nano(lim.monthly_spend_budget),
            1 if lim.hard_budget else 0,
            plan.tokens,
            plan.spend_nano,
            settings.TESSERA_RESERVATION_TTL_SECONDS,
            -1 if seed is None else max(0, seed.spend_nano),
            PERIOD_TTL,
            0 if seed is None else seed.tokens,
        ]
        out = await reserve(keys=_keys(plan.tenant_id, plan.request_id, period), args=args)
        code = int(out[0])
        if code == -1:
            return None
        retry_ms, r_left, r_reset, t_left, t_reset, soft = (int(v) for v in out[1:7])
        requests = WindowState(rpm, r_left, r_reset / 1000) if rpm >= 0 else None
        tokens = WindowState(tpm, t_left, t_reset / 1000) if tpm >= 0 else None
        if code == 0:
            return Decision(True, requests=requests, tokens=tokens, over_soft_budget=bool(soft))
        retry = seconds_to_next_period() if code in (4, 5) else retry_ms / 1000
        return Decision(False, _REASONS[code], retry, requests, tokens)

    async def settle(self, s: Settlement) -> bool:
        _, _, settle, _ = self._scripts()
        args = [
            s.request_id,
            limit_or_unlimited(s.limits.requests_per_minute),
            limit_or_unlimited(s.limits.tokens_per_minute),
            s.actual_tokens - s.reserved_tokens,
            s.actual_spend_nano - s.reserved_spend_nano,
        ]
        settled = bool(await settle(keys=_keys(s.tenant_id, s.request_id, s.period), args=args))
        refusals.slot_freed(s.tenant_id)  # its slot is free: a remembered concurrency refusal ends
        return settled

    async def renew(self, held: Sequence[tuple[int, str]]) -> int:
        *_, renew = self._scripts()
        by_tenant: dict[int, list[str]] = defaultdict(list)
        for tenant_id, request_id in held:
            by_tenant[tenant_id].append(request_id)
        ttl = settings.TESSERA_RESERVATION_TTL_SECONDS
        renewed = 0
        for tenant_id, request_ids in by_tenant.items():  # one script per tenant: its keys share a hash slot
            keys = [_keys(tenant_id, "-", period_start())[1]] + [_keys(tenant_id, rid, period_start())[3] for rid in request_ids]
            renewed += int(await renew(keys=keys, args=[ttl, *request_ids]))
        return renewed

    async def usage(self, *, tenant_id: int, period: dt.date) -> tuple[int, int]:
        tok, sp = await self.client().hmget(_keys(tenant_id, "-", period)[2], "tok", "sp")
        return int(tok or 0), int(sp or 0)

    def usage_sync(self, *, tenant_id: int, period: dt.date) -> tuple[int, int]:
        """For the (sync) management API."""
        timeout = settings.TESSERA_REDIS_TIMEOUT_SECONDS
        client = sync_redis.Redis.from_url(self.url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            tok, sp = client.hmget(_keys(tenant_id, "-", period)[2], "tok", "sp")
        finally:
            client.close()
        return int(tok or 0), int(sp or 0)
