"""cache_aware's table shared by every gateway process, in Redis (docs/routing.md, "Several gateways").

Why: each gateway process remembers what it sent where (prefix_routing.PrefixTable). Behind a load
balancer with N gateways, a tenant's next turn reaches the gateway that routed its last turn about
1/N of the time; the others do not know where its prefix is cached and route it as new.

What Redis holds: per worker, one sorted set `<TESSERA_REDIS_PREFIX>:rt:<blake2b(worker URL)>` whose
members are the 16-byte chunk hashes routed there (prefix_routing.prefix_key: chained from a root
keyed by the tenant's cache salt and the model), scored by when. No prompt text, no tenant id, no
URL: another tenant's identical prompt chains from another root and matches nothing, as in the local
table. Bounded like the local table: each write keeps the newest `capacity_chunks` members (a
prefix's head newest, as the local LRU), and a set expires `ttl_seconds` after its last write (a
worker that left).

The request path asks once: a pipeline of one ZMSCORE per candidate worker, awaited at most
`timeout_seconds` (TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS, 50 ms). What it learns is merged with
the local table (the longer match wins). Writes never hold a request: they are queued and sent by
one flusher task per event loop, batched into one pipeline.

While Redis does not answer (refused, or silent past the timeout) routing uses this process's own
table and no request fails: the first failure logs a warning once and sets
`tessera_gateway_routing_shared_up` to 0; for `retry_seconds` no request asks Redis at all (no added
latency, `tessera_gateway_routing_local_only_total` counts them); then one request asks again, paying
at most the timeout. Writes meanwhile are dropped (the local table has them). When Redis answers
again the gauge returns to 1, a log line says so, and the sets refill as requests are routed: each
routed request writes its whole chain, so a tenant's next turn after the outage restores its prefix.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import redis.exceptions
from prometheus_client import Counter, Gauge

from controlplane.gateway.routing.prefix_routing import PrefixKey

log = logging.getLogger("tessera.gateway")

MAX_PENDING = 4096  # queued writes per event loop; past it the oldest go (the local table still has them)
FLUSH_BATCH = 256  # writes per pipeline
UNREACHABLE = (redis.exceptions.RedisError, OSError, TimeoutError)

# Registered on the SLO registry by the gateway's AppConfig.ready (this module must not import it:
# controlplane.slo.metrics reads the worker registry, which imports this module).
SHARED_UP = Gauge("tessera_gateway_routing_shared_up",
                  "1 while this gateway reads the shared routing table in Redis; 0 while it routes on its own "
                  "table (Redis did not answer, or sharing is off)", registry=None)
LOCAL_ONLY = Counter("tessera_gateway_routing_local_only",
                     "Requests routed on this gateway's own prefix table because the shared one (Redis) did not "
                     "answer", registry=None)


@dataclass(slots=True)
class _OnLoop:
    client: aioredis.Redis  # redis.asyncio connections belong to one event loop
    pending: deque = field(default_factory=lambda: deque(maxlen=MAX_PENDING))  # (worker key, chunks | None = delete)
    flusher: asyncio.Task | None = None


class SharedPrefixes:
    def __init__(self, url: str, *, namespace: str, capacity_chunks: int, ttl_seconds: float,
                 timeout_seconds: float, retry_seconds: float, socket_timeout_seconds: float) -> None:
        if not url:
            raise ValueError("the shared routing table needs REDIS_URL")
        self.url = url
        self.namespace = namespace
        self.capacity_chunks = capacity_chunks
        self.ttl_ms = int(ttl_seconds * 1000)
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = retry_seconds
        self.socket_timeout_seconds = socket_timeout_seconds
        self.up = True
        self._retry_at = 0.0  # monotonic: while down, when a request may ask Redis again
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _OnLoop] = weakref.WeakKeyDictionary()
        SHARED_UP.set(1)

    def key(self, worker_url: str) -> str:
        return f"{self.namespace}:rt:{hashlib.blake2b(worker_url.encode(), digest_size=8).hexdigest()}"

    def _on_loop(self) -> _OnLoop:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            # The limiter's connection settings (tenants/limits/redis.py): REDIS_URL, and sockets bounded
            # by TESSERA_REDIS_TIMEOUT_SECONDS; the request path bounds its one read tighter, below.
            client = aioredis.from_url(self.url, max_connections=64, socket_connect_timeout=self.socket_timeout_seconds,
                                       socket_timeout=self.socket_timeout_seconds)
            state = self._loops[loop] = _OnLoop(client)
        return state

    # --- the request path -------------------------------------------------------------------------

    async def matched_chunks(self, urls: Sequence[str], key: PrefixKey) -> dict[str, int] | None:
        """Per worker, how many of the key's leading chunks some gateway routed there; None while
        Redis is away (route on the local table)."""
        if not key.chunks or not urls:
            return {}
        if not self._may_ask():
            LOCAL_ONLY.inc()
            return None
        pipe = self._on_loop().client.pipeline(transaction=False)
        for url in urls:
            pipe.zmscore(self.key(url), list(key.chunks))
        try:
            async with asyncio.timeout(self.timeout_seconds):
                replies = await pipe.execute()
        except UNREACHABLE as exc:
            self._went_away(exc)
            LOCAL_ONLY.inc()
            return None
        self._answered()
        return {url: _leading(scores) for url, scores in zip(urls, replies, strict=True)}

    def record(self, worker_url: str, key: PrefixKey) -> None:
        """The request went to `worker_url`: tell the other gateways (in the background)."""
        if key.chunks:
            self._enqueue(self.key(worker_url), key.chunks)

    def forget(self, worker_url: str) -> None:
        """The worker restarted or left: nothing is cached there any more, for any gateway."""
        self._enqueue(self.key(worker_url), None)

    # --- writes, off the request path -------------------------------------------------------------

    def _enqueue(self, name: str, chunks: tuple[bytes, ...] | None) -> None:
        if not self.up and time.monotonic() < self._retry_at:
            return  # away: the local table has it
        try:
            state = self._on_loop()
        except RuntimeError:  # no event loop (a synchronous caller): nothing could send it
            return
        state.pending.append((name, chunks))
        if state.flusher is None or state.flusher.done():
            state.flusher = asyncio.get_running_loop().create_task(self._flush(state))

    async def _flush(self, state: _OnLoop) -> None:
        while state.pending:
            batch = [state.pending.popleft() for _ in range(min(FLUSH_BATCH, len(state.pending)))]
            pipe = state.client.pipeline(transaction=False)
            now = time.time()
            for name, chunks in batch:
                if chunks is None:
                    pipe.delete(name)
                    continue
                # Head newest (1 µs apart): trimming drops a prefix's tail before its head, as the engine does.
                pipe.zadd(name, {h: now - i * 1e-6 for i, h in enumerate(chunks)})
                pipe.zremrangebyrank(name, 0, -self.capacity_chunks - 1)
                pipe.pexpire(name, self.ttl_ms)
            try:
                await pipe.execute()
            except UNREACHABLE as exc:
                self._went_away(exc)
                state.pending.clear()
                return
            self._answered()

    async def drain(self) -> None:
        """Wait until this loop's queued writes are sent (tests; a clean shutdown)."""
        state = self._loops.get(asyncio.get_running_loop())
        while state is not None and state.flusher is not None and not state.flusher.done():
            await state.flusher

    # --- Redis away and back ----------------------------------------------------------------------

    def _may_ask(self) -> bool:
        if self.up:
            return True
        now = time.monotonic()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.retry_seconds  # this request tries; the others keep to the local table
        return True

    def _went_away(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self.retry_seconds
        if self.up:
            self.up = False
            SHARED_UP.set(0)
            log.warning("shared routing table unreachable: routing on this gateway's own table",
                        extra={"error": repr(exc), "retry_seconds": self.retry_seconds})

    def _answered(self) -> None:
        if not self.up:
            self.up = True
            SHARED_UP.set(1)
            log.info("shared routing table answers again: routing on the gateways' shared table")


def _leading(scores: list[float | None]) -> int:
    """A chain: the first chunk not held ends the shared prefix."""
    n = 0
    for score in scores:
        if score is None:
            break
        n += 1
    return n


def from_settings(settings, capacity_chunks: int) -> SharedPrefixes | None:
    """The process's shared table, or None when sharing is off or there is no Redis."""
    if not getattr(settings, "TESSERA_ROUTING_SHARED", False) or not settings.REDIS_URL:
        SHARED_UP.set(0)
        return None
    return SharedPrefixes(
        settings.REDIS_URL, namespace=settings.TESSERA_REDIS_PREFIX, capacity_chunks=capacity_chunks,
        ttl_seconds=settings.TESSERA_ROUTING_SHARED_TTL_SECONDS,
        timeout_seconds=settings.TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS,
        retry_seconds=settings.TESSERA_ROUTING_SHARED_RETRY_SECONDS,
        socket_timeout_seconds=settings.TESSERA_REDIS_TIMEOUT_SECONDS)
