"""The gateway as deployed (uvicorn + controlplane.asgi) on a real socket: the official `openai`
client against it, and a client disconnect cancelling the worker's request."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from . import sink

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def client_for(base_url: str, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=secret, max_retries=0, timeout=10)


def test_openai_client_chat_stream_completions_models(live_gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=1000)
    client = client_for(live_gateway, secret)

    chat = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.content == "t0 t1 t2 "
    assert chat.usage.prompt_tokens_details.cached_tokens == 3

    chunks = list(client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True},
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "t0 t1 t2 "
    assert chunks[-1].usage.completion_tokens == 3

    completion = client.completions.create(model="fake-model", prompt="Once upon a time, in a land far away", max_tokens=2)
    assert completion.choices[0].text == "t0 t1 "
    assert {m.id for m in client.models.list()} == {"fake-model", "fake-lora"}

    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert raw.headers["x-request-id"].startswith("req_")
    assert raw.headers["x-ratelimit-limit-requests"] == "1000"
    wait_for(lambda: len(sink.EVENTS) == 4)


def test_openai_client_error_classes(live_gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=1, key_fields={"allowed_adapters": ["other-lora"]})
    client = client_for(live_gateway, secret)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as bad_key:
        client_for(live_gateway, "sk-wrong-wrong-wrong-wrong-wrong").models.list()
    assert bad_key.value.code == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="fake-lora", messages=messages, max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=messages, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake-model", messages=[], max_tokens=1)
    client.chat.completions.create(model="fake-model", messages=messages, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="fake-model", messages=messages, max_tokens=1)
    assert limited.value.code == "rate_limit_exceeded"
    assert int(limited.value.response.headers["retry-after"]) >= 1


def test_client_disconnect_mid_stream_cancels_the_worker_request(live_gateway, tenant_key, workers):
    _, secret = tenant_key.sync()
    for worker in workers:
        worker.token_delay = 0.05
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 200,
            "stream": True}
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{live_gateway}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {secret}"}) as response:
            request_id = response.headers["x-request-id"]
            received = 0
            for line in response.iter_lines():
                if line.startswith("data: "):
                    received += 1
                if received == 3:
                    break  # leaving the block closes the connection
    wait_for(lambda: any(request_id in w.disconnected for w in workers))
    wait_for(lambda: len(sink.EVENTS) == 1)
    (event,) = sink.EVENTS
    assert event.request_id == request_id and event.status == "partial"
    assert 3 <= event.completion_tokens < 20  # what was delivered, not the 200 asked for
    assert not any(request_id in w.finished for w in workers)


def test_client_disconnect_without_streaming_cancels_the_worker_request(live_gateway, tenant_key, workers):
    _, secret = tenant_key.sync(max_concurrent_requests=1)
    for worker in workers:
        worker.token_delay = 0.05  # 100 tokens: 5 s
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 100}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live_gateway}/v1/chat/completions", json=body, timeout=0.5,
                   headers={"Authorization": f"Bearer {secret}"})
    wait_for(lambda: any(w.disconnected for w in workers))
    wait_for(lambda: len(sink.EVENTS) == 1)
    (event,) = sink.EVENTS
    (worker,) = [w for w in workers if w.disconnected]
    # Billed what the worker generated before the client left (its count, asked after the abort).
    reported = worker.usage[event.request_id]
    assert event.status == "partial" and event.http_status == 499
    assert 0 < event.completion_tokens == reported["completion_tokens"] < 100 and event.prompt_tokens == 7
    for worker in workers:
        worker.token_delay = 0.0
    response = httpx.post(f"{live_gateway}/v1/chat/completions", json={**body, "max_tokens": 1}, timeout=10,
                          headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200  # the concurrency slot was released
