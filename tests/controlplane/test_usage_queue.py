"""TESSERA_USAGE_QUEUE=redis: the gateway only queues events; usage_consume writes them, once."""

from __future__ import annotations

import json

import pytest
import redis
from django.test import AsyncClient

from controlplane.asyncdb import db_call
from controlplane.gateway import usage_queue

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
