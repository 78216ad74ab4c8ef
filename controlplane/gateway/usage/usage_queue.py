"""Optional: usage events through a Redis list, ingested by `manage.py usage_consume`.

With TESSERA_USAGE_QUEUE=redis the gateway only RPUSHes each event (one round trip, ~0.1 ms) and
a separate consumer process writes the ledger in batches. Billing's ingest costs a few ms of CPU
per event; inline (the default, usage_writer.py) that CPU competes with serving in the gateway
process. Reliable-queue pattern: the consumer LMOVEs events to its own processing list and
removes them only after the ledger transaction committed; on start it first re-ingests whatever
a crashed run left there. Ingest is idempotent on the request id, so that never bills twice.

One bad event must not stop billing: a batch that fails is written again event by event, and an
event that cannot be written (undecodable, a version-skewed payload, refused by the ledger) goes to
the dead-letter list `<prefix>:usage:dead` with the reason, while the rest are written. A database
that is unreachable is not the event's fault: the batch stays in the processing list and is
retried. The journal rows of written events are deleted in the same transaction (journal.py).
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
from django.db import InterfaceError, OperationalError, close_old_connections, transaction

from billing.events import UsageEvent
from controlplane.gateway.usage import journal

log = logging.getLogger("tessera.gateway")

_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pending_key() -> str:
    return f"{settings.TESSERA_REDIS_PREFIX}:usage:pending"


def processing_key(name: str) -> str:
    return f"{settings.TESSERA_REDIS_PREFIX}:usage:processing:{name}"


def dead_key() -> str:
    return f"{settings.TESSERA_REDIS_PREFIX}:usage:dead"


TRANSIENT = (OperationalError, InterfaceError)  # the database is away: retry the batch, blame no event
_FIELDS = frozenset(f.name for f in dataclasses.fields(UsageEvent))


def dumps(event: UsageEvent) -> bytes:
    return orjson.dumps(dataclasses.asdict(event))


def loads(raw: bytes) -> UsageEvent:
    """The event; ValueError/TypeError/KeyError for one that cannot be read. Fields this version does not
    know (written by a newer gateway) are ignored rather than refused, so a rollout does not dead-letter."""
    data = orjson.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a usage event must be a JSON object")
    data = {k: v for k, v in data.items() if k in _FIELDS}
    data["created_at"] = dt.datetime.fromisoformat(data["created_at"])
    return UsageEvent(**data)


def _write(sink, events: list[UsageEvent]) -> None:
    with transaction.atomic():
        for event in events:
            sink(event=event)
        journal.forget(event.request_id for event in events)


def _ingest(client: redis.Redis, sink, items: list[bytes]) -> None:
    """Write a batch; poison events to the dead-letter list. Raises only for a database outage."""
    try:
        _write(sink, [loads(raw) for raw in items])
        return
    except TRANSIENT:
        raise
    except Exception:
        log.warning("usage batch failed; writing its %d events one by one", len(items), exc_info=True)
    dead = []
    for raw in items:
        try:
            _write(sink, [loads(raw)])
        except TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001 - this event's fault: set it aside with the reason
            log.error("usage event dead-lettered", extra={"reason": repr(exc), "event": raw[:2000].decode("utf-8", "replace")})
            dead.append(orjson.dumps({"event": raw.decode("utf-8", "replace"), "reason": f"{type(exc).__name__}: {exc}",
                                      "at": dt.datetime.now(dt.UTC).isoformat()}))
    if dead:
        client.rpush(dead_key(), *dead)


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
            _ingest(client, sink, items)
            client.ltrim(processing, len(items), -1)  # committed (or dead-lettered): drop exactly these
            done += len(items)
    finally:
        client.close()
        close_old_connections()
