"""The worker that served a request travels the ledger's exactly-once path, and beat's tasks cost it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.billing.cost_fixtures import rate, ready_replica

pytestmark = pytest.mark.django_db


def test_the_worker_survives_the_usage_queue_and_the_spool(make_event):
    from controlplane.gateway.usage import spool, usage_queue

    event = make_event(worker_url="http://w1:8000")
    assert usage_queue.loads(usage_queue.dumps(event)).worker_url == "http://w1:8000"
    kind, replayed, _ = spool._decode(spool._encode(spool.EVENT, event))
    assert kind == spool.EVENT and replayed.worker_url == "http://w1:8000"
    old = usage_queue.dumps(event).replace(b',"worker_url":"http://w1:8000"', b"")  # an older gateway's event
    assert usage_queue.loads(old).worker_url == ""


def test_ingest_keeps_the_worker_and_a_replay_keeps_the_first(make_event, ingest):
    event = make_event(worker_url="http://w1:8000")
    assert ingest(event).worker_url == "http://w1:8000"
    from dataclasses import replace

    assert ingest(replace(event, worker_url="http://w2:8000")).worker_url == "http://w1:8000"


def test_beat_tasks_observe_replicas_and_cost_the_current_hour(make_event, ingest):
    from billing import tasks
    from billing.models import ReplicaHourCost, RequestCost

    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    replica = ready_replica(ready_at=hour - timedelta(hours=3))
    rate(start=hour - timedelta(days=1))
    assert tasks.replica_spans_observe() == 1
    ingest(make_event(created_at=hour + (now - hour) / 2, worker_url=replica.worker.url))
    assert tasks.cost_hours_rebuild() == 1
    assert RequestCost.objects.count() == 1
    current = ReplicaHourCost.objects.get(hour=hour)
    assert current.attributed_cost + current.idle_cost == current.total_cost


def test_the_gateway_meter_names_its_worker_in_the_usage_event(monkeypatch):
    import asyncio
    import datetime as dt
    import time
    from types import SimpleNamespace

    from controlplane.gateway.routing.workers import ModelTarget
    from controlplane.gateway.usage import accounting

    events = []

    async def account(self, event, resolve=None):
        events.append(event)

    monkeypatch.setattr(accounting.Meter, "_account", account)
    limits = SimpleNamespace(tier="standard", slo_ttft_p95_ms=None, slo_itl_p95_ms=None)
    meter = accounting.Meter(
        request_id="req-w", principal=SimpleNamespace(tenant_id=1, key_id=2, limits=limits),
        target=ModelTarget(name="llama-8b", base="llama-8b", adapter=None), plan=None, period=dt.date(2026, 11, 1),
        created_at=dt.datetime(2026, 11, 10, tzinfo=dt.UTC), started=time.perf_counter(),
        worker_url="http://w1:8000")

    async def finish():
        meter.finish(status="ok", prompt_tokens=3, completion_tokens=1)
        await accounting.drain()

    asyncio.run(finish())
    assert events[0].worker_url == "http://w1:8000"
