"""End to end: the official `openai` client → the gateway (uvicorn) → a real SmolLM2 worker."""

from __future__ import annotations

import json
import re
import time

import openai
import pytest

from tests.dataplane.worker.process import MODEL, running

from . import sink
from .conftest import serving_gateway

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]

SYSTEM = "You are a concise assistant for the Tessera test suite. " * 8  # long enough to fill cache blocks


@pytest.fixture(scope="module")
def real_worker():
    with running() as worker:
        yield worker


@pytest.fixture
def e2e_gateway(real_worker, gateway):
    with serving_gateway(gateway, real_worker) as url:
        yield url


def wait_events(n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(sink.EVENTS) < n:
        assert time.monotonic() < deadline, f"{len(sink.EVENTS)} of {n} usage events"
        time.sleep(0.05)


def test_openai_client_through_the_gateway_to_a_real_worker(e2e_gateway, tenant_key):
    tenant, secret = tenant_key.sync(requests_per_minute=100, key_fields={"allowed_adapters": ["none"]})
    client = openai.OpenAI(base_url=f"{e2e_gateway}/v1", api_key=secret, max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]

    assert MODEL in {m.id for m in client.models.list()}
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert first.choices[0].message.content and 1 <= first.usage.completion_tokens <= 8
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # same tenant salt, same worker: prefix reused

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                  stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == first.choices[0].message.content  # greedy: the same text, streamed
    assert all(c.usage is None for c in chunks)  # the gateway's own usage request stays hidden

    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    assert completion.choices[0].text and completion.usage.completion_tokens <= 5

    wait_events(4)
    by_id = {e.request_id: e for e in sink.EVENTS}
    assert len(by_id) == 4 and {e.status for e in by_id.values()} == {"ok"}
    streamed_event = sink.EVENTS[2]  # metered from the worker's usage chunk, which the client never saw
    assert streamed_event.completion_tokens == first.usage.completion_tokens
    assert streamed_event.cached_tokens > 0 and streamed_event.ttft_ms < streamed_event.latency_ms
    assert all(e.tenant_id == tenant.pk and e.model == MODEL for e in sink.EVENTS)

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{e2e_gateway}/v1", api_key="sk-nope-nope-nope-nope-nope", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=1)


def test_rate_limit_error_class_through_a_real_worker(e2e_gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=1)
    client = openai.OpenAI(base_url=f"{e2e_gateway}/v1", api_key=secret, max_retries=0, timeout=120)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert exc.value.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_structured_outputs_through_the_gateway(e2e_gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=100)
    client = openai.OpenAI(base_url=f"{e2e_gateway}/v1", api_key=secret, max_retries=0, timeout=120)
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}},
              "required": ["colour", "hex"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "colour", "schema": schema, "strict": True}}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                         max_tokens=30, temperature=0, response_format=fmt)
    value = json.loads(out.choices[0].message.content)
    assert value["colour"] in ("red", "green", "blue") and re.fullmatch("#[0-9a-f]{6}", value["hex"])
    with pytest.raises(openai.BadRequestError) as bad:  # the worker's 400 reaches the client as OpenAI's
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert bad.value.body["param"] == "response_format" and "invalid JSON schema" in bad.value.message
