"""The gateway through Django's async client, in front of two fake workers (real HTTP servers)."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from . import sink
from .fake_worker import CACHED_TOKENS, PROMPT_TOKENS

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}


def auth(secret: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {secret}"}}


async def post(client: AsyncClient, secret: str | None, body, path: str = "/v1/chat/completions"):
    headers = auth(secret) if secret else {}
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return await client.post(path, data=data, content_type="application/json", **headers)


async def read_stream(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


def sse_payloads(raw: bytes) -> list:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_chat_completion_is_proxied_with_tenant_headers(gateway, tenant_key, workers, drain):
    tenant, secret = await tenant_key(requests_per_minute=100, tokens_per_minute=100_000)
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "t0 t1 t2 t3 "
    request_id = response["x-request-id"]
    assert request_id.startswith("req_")
    assert response["x-ratelimit-limit-requests"] == "100"
    assert response["x-ratelimit-remaining-requests"] == "99"
    assert response["x-ratelimit-limit-tokens"] == "100000"
    assert response["x-ratelimit-reset-requests"].endswith(("ms", "s"))

    (received,) = [r for w in workers for r in w.received]
    assert received.headers["x-request-id"] == request_id
    assert received.headers["x-priority"] == "7"
    assert received.headers["x-cache-salt"] == tenant.cache_salt
    assert received.headers["x-tenant-id"] == tenant.slug
    assert received.headers["authorization"] == "Bearer worker-secret"
    assert received.body == CHAT  # forwarded untouched

    await drain()
    (event,) = sink.EVENTS
    assert (event.request_id, event.tenant_id, event.model, event.adapter, event.status) == (
        request_id, tenant.pk, "fake-model", None, "ok")
    assert (event.prompt_tokens, event.cached_tokens, event.completion_tokens) == (PROMPT_TOKENS, CACHED_TOKENS, 4)
    assert event.tier == tenant.tier.name and event.latency_ms > 0 and event.created_at.tzinfo is not None


async def test_streaming_relays_sse_and_hides_the_usage_chunk_unless_asked(gateway, tenant_key, workers, drain):
    _, secret = await tenant_key()
    response = await post(AsyncClient(), secret, {**CHAT, "stream": True})
    assert response.status_code == 200 and response["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(await read_stream(response))
    assert payloads[-1] == "[DONE]"
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in payloads[:-1]) == "t0 t1 t2 t3 "
    assert all(p["choices"] for p in payloads[:-1])  # the usage-only chunk was stripped
    # ... but the worker was asked for it, so the gateway could meter the stream exactly
    (received,) = [r for w in workers for r in w.received]
    assert received.body["stream_options"] == {"include_usage": True}
    await drain()
    (event,) = sink.EVENTS
    assert (event.status, event.prompt_tokens, event.completion_tokens) == ("ok", PROMPT_TOKENS, 4)
    assert event.ttft_ms is not None and event.ttft_ms <= event.latency_ms

    response = await post(AsyncClient(), secret, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    payloads = sse_payloads(await read_stream(response))
    assert payloads[-2]["choices"] == [] and payloads[-2]["usage"]["completion_tokens"] == 4


async def test_completions_endpoint(gateway, tenant_key, drain):
    _, secret = await tenant_key()
    body = {"model": "fake-model", "prompt": "Once upon a time, in a land far away", "max_tokens": 3}
    response = await post(AsyncClient(), secret, body, "/v1/completions")
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "t0 t1 t2 "
    response = await post(AsyncClient(), secret, {**body, "stream": True}, "/v1/completions")
    text = "".join(p["choices"][0]["text"] for p in sse_payloads(await read_stream(response))[:-1])
    assert text == "t0 t1 t2 "
    await drain()
    assert [e.completion_tokens for e in sink.EVENTS] == [3, 3]


@pytest.mark.parametrize(
    ("header", "status", "code"),
    [
        (None, 401, "invalid_api_key"),
        ("Basic abc", 401, "invalid_api_key"),
        ("Bearer sk-not-a-real-key-at-all-0000000", 401, "invalid_api_key"),
    ],
)
async def test_bad_credentials(gateway, header, status, code):
    headers = {"Authorization": header} if header else {}
    response = await AsyncClient().post(
        "/v1/chat/completions", data=json.dumps(CHAT), content_type="application/json", headers=headers
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and "message" in error
    assert response["x-request-id"].startswith("req_")


async def test_revoked_expired_and_suspended_are_refused(gateway, tenant_key):
    from asgiref.sync import sync_to_async
    from django.utils import timezone

    from tenants import services
    from tenants.models import APIKey

    tenant, secret = await tenant_key()
    key = await APIKey.objects.aget(tenant=tenant)
    await sync_to_async(services.tenant_suspend)(tenant=tenant)
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 403 and response.json()["error"]["code"] == "tenant_suspended"
    await sync_to_async(services.tenant_activate)(tenant=tenant)
    assert (await post(AsyncClient(), secret, CHAT)).status_code == 200

    await APIKey.objects.filter(pk=key.pk).aupdate(expires_at=timezone.now())
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]

    await APIKey.objects.filter(pk=key.pk).aupdate(expires_at=None)
    await sync_to_async(services.api_key_revoke)(tenant=tenant, key=key)
    assert (await post(AsyncClient(), secret, CHAT)).status_code == 401


async def test_model_scopes_unknown_models_and_the_model_list(gateway, tenant_key):
    _, secret = await tenant_key(key_fields={"allowed_models": ["fake-model"], "allowed_adapters": ["other-lora"]})
    response = await post(AsyncClient(), secret, {**CHAT, "model": "fake-lora"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "model_not_allowed"
    response = await post(AsyncClient(), secret, {**CHAT, "model": "no-such-model"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    listed = (await AsyncClient().get("/v1/models", **auth(secret))).json()
    assert [m["id"] for m in listed["data"]] == ["fake-model"]

    _, any_secret = await tenant_key()
    listed = (await AsyncClient().get("/v1/models", **auth(any_secret))).json()["data"]
    assert {m["id"]: m.get("parent") for m in listed} == {"fake-lora": "fake-model", "fake-model": None}
    detail = await AsyncClient().get("/v1/models/fake-lora", **auth(any_secret))
    assert detail.json()["parent"] == "fake-model"
    assert (await AsyncClient().get("/v1/models/nope", **auth(any_secret))).status_code == 404
    assert (await AsyncClient().get("/v1/models")).status_code == 401


async def test_adapter_requests_are_metered_against_the_base_model(gateway, tenant_key, drain):
    _, secret = await tenant_key(key_fields={"allowed_adapters": ["fake-lora"]})
    assert (await post(AsyncClient(), secret, {**CHAT, "model": "fake-lora"})).status_code == 200
    await drain()
    assert (sink.EVENTS[0].model, sink.EVENTS[0].adapter) == ("fake-model", "fake-lora")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "fake-model", "messages": []}, "messages"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "stream": "yes"}, "stream"),
    ],
)
async def test_invalid_requests(gateway, tenant_key, body, param):
    _, secret = await tenant_key()
    response = await post(AsyncClient(), secret, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


async def test_requests_per_minute_429_with_openai_headers(gateway, tenant_key, drain):
    _, secret = await tenant_key(requests_per_minute=2)
    statuses = [(await post(AsyncClient(), secret, CHAT)).status_code for _ in range(2)]
    refused = await post(AsyncClient(), secret, CHAT)
    assert statuses == [200, 200] and refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert refused["x-ratelimit-limit-requests"] == "2"
    assert refused["x-ratelimit-remaining-requests"] == "0"
    assert 20 <= int(refused["Retry-After"]) <= 30 and int(refused["retry-after-ms"]) > 20_000
    assert refused["x-ratelimit-reset-requests"].endswith("s")
    await drain()
    assert len(sink.EVENTS) == 2  # a refused request is never metered


async def test_tokens_per_minute_settles_to_actual_usage(gateway, tenant_key, drain):
    _, secret = await tenant_key(tokens_per_minute=10_000)
    first = await post(AsyncClient(), secret, {**CHAT, "max_tokens": 2000})
    reserved_remaining = int(first["x-ratelimit-remaining-tokens"])
    assert reserved_remaining < 8000  # the reservation counted max_tokens
    await drain()  # settled: 7 prompt + 2000 generated... the fake generates max_tokens tokens
    second = await post(AsyncClient(), secret, {**CHAT, "max_tokens": 1})
    assert int(second["x-ratelimit-remaining-tokens"]) > reserved_remaining - 100


async def test_monthly_token_budget_429_insufficient_quota(gateway, tenant_key):
    _, secret = await tenant_key(monthly_token_budget=50)
    response = await post(AsyncClient(), secret, {**CHAT, "max_tokens": 100})
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "insufficient_quota"
    assert response.json()["error"]["type"] == "insufficient_quota"
    assert int(response["Retry-After"]) >= 1


async def test_upstream_error_status_passes_through_and_releases(gateway, tenant_key, workers, drain):
    _, secret = await tenant_key(max_concurrent_requests=1)
    for worker in workers:
        worker.fail_status = 500
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 500 and response.json()["error"]["code"] == "injected"
    await drain()
    assert sink.EVENTS[0].status == "error" and sink.EVENTS[0].completion_tokens == 0
    for worker in workers:
        worker.fail_status = None
    assert (await post(AsyncClient(), secret, CHAT)).status_code == 200  # the concurrency slot came back


async def test_no_ready_worker_is_503_and_releases(gateway, tenant_key, workers, drain):
    _, secret = await tenant_key(max_concurrent_requests=1)
    for worker in workers:
        worker.ready = False
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 503 and response.json()["error"]["code"] == "model_unavailable"
    await drain()
    assert sink.EVENTS[0].status == "error"
    for worker in workers:
        worker.ready = True
    from controlplane.gateway.routing.workers import get_registry

    await get_registry().refresh()
    assert (await post(AsyncClient(), secret, CHAT)).status_code == 200


async def test_connection_failure_before_first_byte_retries_another_worker(gateway, tenant_key, workers, drain):
    from controlplane.gateway.routing.workers import Worker, get_registry

    _, secret = await tenant_key()
    registry = get_registry()
    await registry.ensure_polling()
    live = registry.workers[0]
    # A worker that was ready at the last poll but now refuses connections, and is the least loaded.
    dead = Worker("http://127.0.0.1:9", ready=True, models=dict(live.models))
    registry.workers.insert(0, dead)
    for worker in registry.workers[1:]:
        worker.outstanding = 100
    try:
        response = await post(AsyncClient(), secret, CHAT)
    finally:
        for worker in registry.workers[1:]:
            worker.outstanding -= 100
    assert response.status_code == 200
    assert not dead.ready and dead.failures == 1
    await drain()
    assert len(sink.EVENTS) == 1 and sum(sink.DELIVERIES.values()) == 1


async def test_every_answer_is_openai_shaped_with_a_request_id(gateway, tenant_key):
    _, secret = await tenant_key()
    wrong_method = await AsyncClient().get("/v1/chat/completions", **auth(secret))
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    unknown = await AsyncClient().post("/v1/audio/speech", data="{}", content_type="application/json", **auth(secret))
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    assert all(r["x-request-id"].startswith("req_") for r in (wrong_method, unknown))


async def test_an_internal_error_releases_the_reservation(gateway, tenant_key, drain, monkeypatch):
    from controlplane.gateway import proxy

    _, secret = await tenant_key(max_concurrent_requests=1)

    async def broken(*args, **kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(proxy, "open_upstream", broken)
    response = await post(AsyncClient(), secret, CHAT)
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"
    await drain()
    assert sink.EVENTS[0].status == "error"
    monkeypatch.undo()
    assert (await post(AsyncClient(), secret, CHAT)).status_code == 200  # the slot was released
