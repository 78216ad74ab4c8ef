"""Optional: usage events through a Redis list, ingested by `manage.py usage_consume`.

With TESSERA_USAGE_QUEUE=redis the gateway only RPUSHes each event (one round trip, ~0.1 ms) and
a separate consumer process writes the ledger in batches. Billing's ingest costs a few ms of CPU
per event; inline (the default, usage_writer.py) that CPU competes with serving in the gateway
process. Reliable-queue pattern: the consumer LMOVEs events to its own processing list and
removes them only after the ledger transaction committed; on start it first re-ingests whatever
a crashed run left there. Ingest is idempotent on the request id, so that never bills twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import weakref

import orjson
import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import close_old_connections, transaction

from billing.events import UsageEvent

log = logging.getLogger("tessera.gateway")

_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pending_key() -> str:
    return f"{settings.TESSERA_REDIS_PREFIX}:usage:pending"


def processing_key(name: str) -> str:
    return f"{settings.TESSERA_REDIS_PREFIX}:usage:processing:{name}"


def dumps(event: UsageEvent) -> bytes:
    return orjson.dumps(dataclasses.asdict(event))


def loads(raw: bytes) -> UsageEvent:
    data = orjson.loads(raw)
    data["created_at"] = dt.datetime.fromisoformat(data["created_at"])
    return UsageEvent(**data)


async def push(event: UsageEvent) -> None:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = aioredis.from_url(settings.REDIS_URL, max_connections=64)
    await client.rpush(pending_key(), dumps(event))


def consume(*, sink, name: str = "default", batch: int = 200, once: bool = False, block_seconds: float = 1.0) -> int:
    """Move events from the pending list to the ledger until stopped (or, with once, until empty).
    Returns how many events were ingested."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    pending, processing = pending_key(), processing_key(name)
    done = 0
    try:
        while True:
            items = client.lrange(processing, 0, -1)  # left over by a crash, or the batch we just took
            if not items:
                first = client.blmove(pending, processing, block_seconds, "LEFT", "RIGHT")
                if first is None:
                    if once:
                        return done
                    continue
                items = [first]
                while len(items) < batch and (more := client.lmove(pending, processing, "LEFT", "RIGHT")):
                    items.append(more)
            close_old_connections()
            events = [loads(raw) for raw in items]
            with transaction.atomic():
                for event in events:
                    sink(event=event)
            client.ltrim(processing, len(items), -1)  # committed: drop exactly what was ingested
            done += len(items)
    finally:
        client.close()
        close_old_connections()
