"""TESSERA_USAGE_QUEUE=redis: the gateway only queues events; usage_consume writes them, once."""

from __future__ import annotations

import json

import pytest
import redis
from django.test import AsyncClient

from common.asyncdb import db_call
from controlplane.gateway.usage import usage_queue

from . import sink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def queued(use_redis_limiter, gateway):
    gateway.TESSERA_USAGE_QUEUE = "redis"
    client = redis.Redis.from_url(gateway.REDIS_URL)
    yield client
    client.delete(usage_queue.pending_key(), usage_queue.processing_key("default"), usage_queue.processing_key("t"))
    client.close()


async def test_gateway_queues_and_the_consumer_ingests_once(queued, tenant_key, drain):
    _, secret = await tenant_key()
    for _ in range(3):
        response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(BODY),
                                            content_type="application/json", headers={"Authorization": f"Bearer {secret}"})
        assert response.status_code == 200
    await drain()
    assert sink.EVENTS == [] and queued.llen(usage_queue.pending_key()) == 3
    ingested = await db_call(usage_queue.consume, sink=sink.collect, once=True)
    assert ingested == 3 and len(sink.EVENTS) == 3 and set(sink.DELIVERIES.values()) == {1}
    assert queued.llen(usage_queue.pending_key()) == 0
    assert queued.llen(usage_queue.processing_key("default")) == 0
    assert sink.EVENTS[0].completion_tokens == 2 and sink.EVENTS[0].created_at.tzinfo is not None


async def test_a_crashed_consumers_batch_is_ingested_on_restart(queued, tenant_key):
    from datetime import UTC, datetime

    from billing.events import UsageEvent

    event = UsageEvent("req_crash", 1, None, "fake-model", None, "free", 5, 0, 1, None, 3.0, "ok", datetime.now(UTC))
    queued.rpush(usage_queue.processing_key("t"), usage_queue.dumps(event))  # taken, never committed
    ingested = await db_call(usage_queue.consume, sink=sink.collect, name="t", once=True)
    assert ingested == 1 and sink.EVENTS == [event]
    assert queued.llen(usage_queue.processing_key("t")) == 0


async def test_poison_events_are_dead_lettered_and_the_rest_written_to_the_ledger(queued, tenant_key):
    """One bad event (undecodable, version-skewed, an unknown tenant) used to stop all billing
    ingestion: the batch's transaction failed and was retried forever. A deleted key is not poison:
    its usage is still the tenant's."""
    from datetime import UTC, datetime

    import orjson

    from billing.events import UsageEvent
    from billing.models import UsageRecord
    from billing.services import usage_record_ingest
    from tenants.models import APIKey

    tenant, _ = await tenant_key()
    key = await APIKey.objects.filter(tenant=tenant).afirst()

    def event(request_id, **fields):
        base = dict(request_id=request_id, tenant_id=tenant.pk, api_key_id=key.pk, model="fake-model", adapter=None,
                    tier="free", prompt_tokens=5, cached_tokens=0, completion_tokens=2, ttft_ms=None, latency_ms=3.0,
                    status="ok", created_at=datetime.now(UTC))
        return usage_queue.dumps(UsageEvent(**{**base, **fields}))

    newer = orjson.loads(event("req_newer_gateway"))
    newer["a_field_from_the_future"] = 1
    skewed = orjson.loads(event("req_skewed"))
    del skewed["created_at"]
    items = [
        event("req_good"),
        b"{not json",
        orjson.dumps(skewed),
        event("req_strings", prompt_tokens="five"),
        event("req_no_tenant", tenant_id=987654321),
        orjson.dumps(newer),
        event("req_deleted_key", api_key_id=key.pk + 10_000),
    ]
    queued.rpush(usage_queue.pending_key(), *items)
    ingested = await db_call(usage_queue.consume, sink=usage_record_ingest, once=True)
    assert ingested == len(items)
    written = {r.request_id: r async for r in UsageRecord.objects.all()}
    assert set(written) == {"req_good", "req_newer_gateway", "req_deleted_key"}
    assert written["req_deleted_key"].api_key_id is None and written["req_deleted_key"].tenant_id == tenant.pk
    dead = [orjson.loads(raw) for raw in queued.lrange(usage_queue.dead_key(), 0, -1)]
    queued.delete(usage_queue.dead_key())
    assert len(dead) == 4 and all(d["reason"] and d["at"] for d in dead)
    assert dead[0]["event"] == "{not json" and "JSONDecodeError" in dead[0]["reason"]
    assert "created_at" in dead[1]["reason"]
    assert "req_no_tenant" in dead[3]["event"]
    assert queued.llen(usage_queue.processing_key("default")) == 0 and queued.llen(usage_queue.pending_key()) == 0


async def test_a_database_outage_is_not_blamed_on_the_events(queued, tenant_key, monkeypatch):
    from datetime import UTC, datetime

    from django.db import OperationalError

    from billing.events import UsageEvent

    def down(*, event):
        raise OperationalError("the database is gone")

    event = UsageEvent("req_outage", 1, None, "fake-model", None, "free", 5, 0, 1, None, 3.0, "ok", datetime.now(UTC))
    queued.rpush(usage_queue.pending_key(), usage_queue.dumps(event))
    with pytest.raises(OperationalError):
        await db_call(usage_queue.consume, sink=down, once=True)
    assert queued.llen(usage_queue.processing_key("default")) == 1  # kept for the next run
    assert queued.llen(usage_queue.dead_key()) == 0
    assert await db_call(usage_queue.consume, sink=sink.collect, once=True) == 1
