"""Shedding the lowest tiers first (gateway and worker), and no prompt text in logs unless sampled."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from django.test import AsyncClient

from controlplane.gateway.routing import admission
from dataplane.worker.config import WorkerConfig

from .. import sink

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "SECRET-PROMPT-TEXT"}], "max_tokens": 4}


async def post(client, secret, body=CHAT):
    return await client.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                             headers={"Authorization": f"Bearer {secret}"})


def test_depth_table():
    table = admission.parse_depths("30=4, 20=16")
    assert table == [(20, 16), (30, 4)]
    assert [admission.depth_for(p, table) for p in (0, 10, 20, 25, 30, 99)] == [None, None, 16, 16, 4, 4]
    with pytest.raises(ValueError, match="TESSERA_SHED_QUEUE_DEPTH"):
        admission.parse_depths("20:16")
    worker = SimpleNamespace(waiting=2, outstanding=70, seats=64)
    assert admission.queue_estimate(worker) == 6  # 6 in flight beyond the seats outrun the stale poll


@pytest.mark.django_db(transaction=True)
async def test_free_is_shed_with_retry_after_while_premium_is_admitted(gateway, tenant_key, drain):
    from controlplane.gateway.routing.workers import get_registry
    from controlplane.slo import metrics

    gateway.TESSERA_WORKER_POLL_SECONDS = 3600  # keep the queue figures this test sets
    gateway.TESSERA_SHED_QUEUE_DEPTH = "20=16,30=4"
    _, free = await tenant_key(priority=30)
    _, premium = await tenant_key(priority=10)
    client = AsyncClient()
    assert (await post(client, free)).status_code == 200  # idle: everyone admitted
    for worker in get_registry().workers:
        worker.waiting = 5  # every worker has 5 queued
    await drain()
    before = len(sink.EVENTS)
    refused = await post(client, free)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "overloaded"
    assert int(refused["Retry-After"]) >= 1 and refused["x-request-id"]
    assert (await post(client, premium)).status_code == 200
    await drain()
    assert len(sink.EVENTS) == before + 1  # the shed request reserved and metered nothing
    text = metrics.render().decode()
    assert 'reason="overloaded"' in text
    for worker in get_registry().workers:
        worker.waiting = 3  # below free's depth again
    assert (await post(client, free)).status_code == 200


class _Engine:
    def __init__(self, waiting: int) -> None:
        self.core = SimpleNamespace(scheduler=SimpleNamespace(num_waiting=waiting))  # what the worker asks it


def test_worker_refuses_low_priorities_first():
    from dataplane.worker import errors
    from dataplane.worker.openai_request import Serving

    config = WorkerConfig(model="m", waiting_limits="20=32,30=8")
    serving = Serving.__new__(Serving)
    serving.config = config
    serving.engine = _Engine(waiting=8)
    serving._admit(10)  # premium: only max_waiting applies
    serving._admit(20)  # standard: 8 < 32
    with pytest.raises(errors.WorkerError) as refused:
        serving._admit(30)  # free: 8 >= 8
    assert refused.value.status == 429 and refused.value.code == "priority_shed"
    assert refused.value.headers["Retry-After"] == str(config.retry_after)
    with pytest.raises(ValueError, match="waiting_limits"):
        WorkerConfig(model="m", waiting_limits="30")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rate", [0.0, 1.0])
async def test_prompt_text_is_logged_only_when_sampling_is_on(gateway, tenant_key, drain, caplog, rate):
    from jsonlog import JSONFormatter

    _, secret = await tenant_key(tenant_fields=None)
    from asgiref.sync import sync_to_async

    from tenants import auth
    from tenants.models import Tenant

    await sync_to_async(Tenant.objects.update)(log_content_sample_rate=rate)
    auth.cache_clear()
    caplog.set_level(logging.DEBUG)
    client = AsyncClient()
    assert (await post(client, secret)).status_code == 200
    streamed = await post(client, secret, {**CHAT, "stream": True})
    body = b"".join([c async for c in streamed.streaming_content])
    await drain()
    lines = [JSONFormatter().format(r) for r in caplog.records]
    logged = "\n".join(lines)
    assert any("request finished" in line and "request_id" in line for line in lines)
    if rate == 0.0:
        assert "SECRET-PROMPT-TEXT" not in logged
        assert not [r for r in caplog.records if r.name == "tessera.gateway.content"]
    else:
        assert "SECRET-PROMPT-TEXT" in logged
        completions = [r for r in caplog.records if r.getMessage() == "completion content"]
        assert len(completions) == 2 and all(r.completion for r in completions) and body
