"""Limits under concurrency through the whole gateway: a budget for 10 against 50 at once."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from django.test import AsyncClient

from controlplane.gateway import parsing

from . import sink

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8}


async def wait_until(condition, timeout: float = 15.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def fifty_against_ten(tenant_key, workers, drain, **budget):
    parsed = parsing.parse(json.dumps(BODY).encode(), "chat")
    reserve = parsed.bound_tokens if "monthly_token_budget" in budget else parsed.reserve_tokens  # a hard budget reserves the bound
    if "monthly_token_budget" in budget:
        budget["monthly_token_budget"] = 10 * reserve
    _, secret = await tenant_key(**budget)
    for worker in workers:  # admitted requests wait at the worker until every decision is made
        worker.hold = threading.Event()
    client = AsyncClient()
    tasks = [
        asyncio.ensure_future(
            client.post("/v1/chat/completions", data=json.dumps(BODY), content_type="application/json",
                        headers={"Authorization": f"Bearer {secret}"})
        )
        for _ in range(50)
    ]
    await wait_until(lambda: sum(t.done() for t in tasks) >= 40)
    for worker in workers:
        worker.release()
    responses = await asyncio.gather(*tasks)
    await drain()
    statuses = [r.status_code for r in responses]
    return reserve, responses, statuses


@pytest.mark.parametrize("backend", ["database", pytest.param("redis", marks=pytest.mark.redis)])
async def test_fifty_concurrent_requests_against_a_token_budget_for_ten(backend, request, tenant_key, workers, drain):
    if backend == "redis":
        request.getfixturevalue("use_redis_limiter")
    reserve, responses, statuses = await fifty_against_ten(tenant_key, workers, drain, monthly_token_budget=0)
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    refused = [r for r in responses if r.status_code == 429]
    assert {r.json()["error"]["code"] for r in refused} == {"insufficient_quota"}
    assert len(sink.EVENTS) == 10 and all(n == 1 for n in sink.DELIVERIES.values())
    billed = sum(e.prompt_tokens + e.completion_tokens for e in sink.EVENTS)
    assert billed <= 10 * reserve  # no overrun beyond what was reserved


@pytest.mark.parametrize("backend", ["database", pytest.param("redis", marks=pytest.mark.redis)])
async def test_fifty_concurrent_requests_against_ten_concurrency_slots(backend, request, tenant_key, workers, drain):
    if backend == "redis":
        request.getfixturevalue("use_redis_limiter")
    _, responses, statuses = await fifty_against_ten(tenant_key, workers, drain, max_concurrent_requests=10)
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 429} == {"rate_limit_exceeded"}
    assert all(r["Retry-After"] == "1" for r in responses if r.status_code == 429)
