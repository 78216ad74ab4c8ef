"""An answered /v1 request says where its time went (Server-Timing): the gateway's stages, then the worker's."""

from __future__ import annotations

import pytest
from django.test import AsyncClient

from controlplane.gateway import server_timing

from .test_gateway import CHAT, post, read_stream

pytestmark = pytest.mark.django_db(transaction=True)

GATEWAY_STAGES = ["auth", "checks", "limits", "upstream", "journal"]  # the journal row is written during upstream; "journal" is what was left to wait after it


async def test_a_stream_carries_the_gateway_stages_then_the_workers(gateway, tenant_key, workers, drain):
    _, secret = await tenant_key()
    for w in workers:
        w.server_timing = "accept;dur=1.5, queue;dur=20.0, prefill;dur=30.25, send;dur=0.1"
        w.token_delay = 0.05  # the first token's wait is counted in upstream: the worker's headers come with it
    response = await post(AsyncClient(), secret, {**CHAT, "stream": True})
    assert response.status_code == 200
    header = response["server-timing"]
    stages = server_timing.parse(header)
    assert list(stages) == GATEWAY_STAGES + ["worker-accept", "worker-queue", "worker-prefill", "worker-send"]
    assert (stages["worker-queue"], stages["worker-prefill"]) == (20.0, 30.2)  # re-written at one decimal
    assert all(stages[name] >= 0 for name in GATEWAY_STAGES)
    await read_stream(response)
    await drain()


async def test_a_json_answer_has_the_gateway_stages(gateway, tenant_key, workers, drain):
    _, secret = await tenant_key()
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 200
    assert list(server_timing.parse(response["server-timing"])) == GATEWAY_STAGES
    await drain()


@pytest.mark.parametrize("worker_header", [
    'x;dur=1, <script>;dur=2, q"uote;dur=3', "queue;dur=nan, prefill;dur=-4, send;dur=1e400",
    "queue;dur=12\r\nSet-Cookie: a=b", "queue;desc=\"a,b\";dur=7", "über;dur=1, a b;dur=2",
])
async def test_what_a_worker_sends_is_rewritten_not_passed_on(gateway, tenant_key, workers, drain, worker_header):
    _, secret = await tenant_key()
    for w in workers:
        w.server_timing = worker_header.replace("\r\n", " ")  # what HTTP lets through
    response = await post(AsyncClient(), secret, {**CHAT, "stream": True})
    assert response.status_code == 200
    header = response["server-timing"]
    stages = server_timing.parse(header)
    assert list(stages)[:5] == GATEWAY_STAGES
    extra = {k: v for k, v in stages.items() if k not in GATEWAY_STAGES}
    assert all(k.startswith("worker-") and v >= 0 and v != float("inf") for k, v in extra.items())
    assert "<" not in header and '"' not in header and "cookie" not in header.lower() and header.isascii()
    assert header.count(";") == len(stages)  # name;dur=ms only
    await read_stream(response)
    await drain()


def test_parse_keeps_only_well_formed_durations():
    assert server_timing.parse(None) == {}
    assert server_timing.parse("auth;dur=0.4, limits;dur=3.1") == {"auth": 0.4, "limits": 3.1}
    assert server_timing.parse("cache;desc=hit;dur=2, miss, Big;dur=1, x;dur=abc, y;dur=inf") == {"cache": 2.0}
