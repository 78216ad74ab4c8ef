"""Malformed OpenAI bodies thrown at the gateway (the real ASGI application: GatewayHandler, views,
proxy) in front of the fake workers: random JSON in every field of chat and completions requests,
wrong types, nulls, huge numbers, nested garbage, non-JSON, non-UTF-8, empty and deeply nested
bodies. Never a 5xx (a 500 is the platform's failure: it burns the availability SLO), and every 4xx
is OpenAI's error body.

Hypothesis is seeded (derandomize) so CI runs the same cases every time; raise FUZZ_EXAMPLES to
search longer locally."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .asgi_driver import Reply, call

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

HUGE = st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**64 - 1, -(2**63), 10**30, 1e308, -1e308, 1e-308, 0, -1])
scalars = (st.none() | st.booleans() | st.integers(-(2**64), 2**64) | HUGE
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

def either(valid, garbage=json_values):
    """Mostly what a client would send, sometimes anything: a body with one or two bad fields gets
    further into the gateway than an all-garbage one."""
    return st.one_of(valid, valid, valid, valid, valid, garbage)


content_parts = st.lists(
    either(st.fixed_dictionaries({"type": either(st.sampled_from(["text", "image_url"]))},
                                 optional={"text": either(st.text(max_size=20))})),
    max_size=3,
)
tool_calls = st.lists(either(st.fixed_dictionaries({
    "id": either(st.text(max_size=8)), "type": either(st.just("function")),
    "function": either(st.fixed_dictionaries({"name": either(st.text(max_size=8)),
                                              "arguments": either(st.text(max_size=20))})),
})), max_size=2)
message = st.fixed_dictionaries(
    {"role": either(st.sampled_from(["user", "system", "assistant", "tool"]))},
    optional={"content": either(st.text(max_size=30) | content_parts | st.none()), "name": either(st.text(max_size=8)),
              "tool_calls": either(tool_calls), "tool_call_id": either(st.text(max_size=8))},
)
tools = st.lists(either(st.fixed_dictionaries({"type": either(st.just("function")), "function": either(
    st.fixed_dictionaries({"name": either(st.text(max_size=8))}, optional={"parameters": json_values}))})), max_size=3)
positive = st.integers(1, 5)
common = {
    "stream": either(st.booleans()), "stream_options": either(st.fixed_dictionaries({}, optional={
        "include_usage": either(st.booleans())})),
    "n": either(positive), "max_tokens": either(positive), "temperature": either(st.floats(0, 2)),
    "stop": either(st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=2)), "seed": json_values,
    "user": json_values, "logit_bias": json_values, "response_format": json_values, "top_p": json_values,
}


def chat_bodies():
    return st.fixed_dictionaries({"model": either(st.just("fake-model")), "messages": either(st.lists(either(message),
                                                                                                    min_size=1, max_size=4))},
                                 optional={**common, "max_completion_tokens": either(positive), "tools": either(tools),
                                           "tool_choice": json_values, "parallel_tool_calls": json_values,
                                           "logprobs": json_values, "top_logprobs": json_values,
                                           "structured_outputs": json_values})


def completion_bodies():
    prompts = (st.text(max_size=30) | st.lists(st.text(max_size=8), max_size=3)
               | st.lists(st.integers(-(2**64), 2**64), max_size=4)
               | st.lists(st.lists(st.integers(0, 2**40), max_size=3), max_size=3))
    return st.fixed_dictionaries({"model": either(st.just("fake-model")), "prompt": either(prompts)},
                                 optional={**common, "echo": json_values, "suffix": json_values,
                                           "best_of": json_values, "logprobs": json_values})


# One bad field in an otherwise valid body: every case reaches the field it breaks.
VALID_CHAT = {
    "model": "fake-model", "max_tokens": 2, "n": 1, "stream": False, "stream_options": {"include_usage": False},
    "max_completion_tokens": 2,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann", "tool_call_id": "c1",
                  "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 {"role": "assistant", "content": "ok"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
}
CHAT_PATHS = [
    ("model",), ("messages",), ("messages", 0), ("messages", 1), ("messages", 0, "role"), ("messages", 0, "content"),
    ("messages", 0, "content", 0), ("messages", 0, "content", 0, "type"), ("messages", 0, "content", 0, "text"),
    ("messages", 0, "name"), ("messages", 0, "tool_call_id"), ("messages", 0, "tool_calls"),
    ("messages", 0, "tool_calls", 0), ("messages", 0, "tool_calls", 0, "function"), ("messages", 1, "content"),
    ("tools",), ("tools", 0), ("tools", 0, "function"), ("stream",), ("stream_options",),
    ("stream_options", "include_usage"), ("n",), ("max_tokens",), ("max_completion_tokens",), ("tool_choice",),
    ("temperature",), ("stop",), ("logit_bias",), ("response_format",), ("user",),
]
VALID_COMPLETION = {"model": "fake-model", "prompt": "once upon a time", "max_tokens": 2, "n": 1, "stream": False,
                    "stream_options": {"include_usage": False}}
COMPLETION_PATHS = [("model",), ("prompt",), ("stream",), ("stream_options",), ("stream_options", "include_usage"),
                    ("n",), ("max_tokens",), ("echo",), ("suffix",), ("best_of",), ("logprobs",), ("stop",)]


def _replace(body: dict, path: tuple, value, stream: bool) -> dict:
    body = json.loads(json.dumps(body))  # a deep copy
    body["stream"] = stream if path != ("stream",) else body["stream"]
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


def one_bad_field(valid: dict, paths: list) -> st.SearchStrategy:
    return st.builds(lambda path, value, stream: _replace(valid, path, value, stream),
                     st.sampled_from(paths), json_values, st.booleans())


@FUZZ
@given(body=one_bad_field(VALID_CHAT, CHAT_PATHS))
async def test_chat_one_bad_field(secret, body):
    assert_not_a_failure(await _send("/v1/chat/completions", _dumps(body), secret), body)


@FUZZ
@given(body=one_bad_field(VALID_COMPLETION, COMPLETION_PATHS))
async def test_completions_one_bad_field(secret, body):
    assert_not_a_failure(await _send("/v1/completions", _dumps(body), secret), body)


def assert_not_a_failure(reply: Reply, sent) -> None:
    assert reply.status < 500, (reply.status, reply.body[:300], sent)
    if reply.status >= 400:
        error = json.loads(reply.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, (reply.body[:300], sent)
        assert isinstance(error["message"], str) and isinstance(error["type"], str), reply.body[:300]
        assert error["param"] is None or isinstance(error["param"], str)


@pytest.fixture
def secret(gateway, tenant_key):
    # A tier with every limit, so huge reservations reach the limiter's arithmetic too.
    _, secret = tenant_key.sync(requests_per_minute=10**6, tokens_per_minute=10**9, max_concurrent_requests=1000,
                                monthly_token_budget=10**15)
    return secret


async def _send(path: str, raw: bytes, secret: str) -> Reply:
    from controlplane.asgi import application

    return await call(application, path, [raw], headers={"Authorization": f"Bearer {secret}"})


def _dumps(body) -> bytes:
    return json.dumps(body).encode()


@FUZZ
@given(body=chat_bodies())
async def test_chat_fuzz(secret, body):
    assert_not_a_failure(await _send("/v1/chat/completions", _dumps(body), secret), body)


@FUZZ
@given(body=completion_bodies())
async def test_completions_fuzz(secret, body):
    assert_not_a_failure(await _send("/v1/completions", _dumps(body), secret), body)


@FUZZ
@given(body=json_values)
async def test_any_json_value_as_the_whole_body(secret, body):
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert_not_a_failure(await _send(path, _dumps(body), secret), body)


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=100).map(str.encode))
async def test_bytes_that_are_not_json(secret, raw):
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert_not_a_failure(await _send(path, raw, secret), raw)


SPECIAL = [
    b"", b" ", b"null", b"[]", b"{}", b'"x"', b"1e999", b"NaN", b"\xff\xfe\x00", b'{"model": "\xff"}',
    b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "n": 99999999999999999999999}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "max_tokens": "x"}',
    _dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}] * 20_000, "max_tokens": 1}),
    _dumps({"model": "fake-model", "prompt": [""] * 100_000, "max_tokens": 2**31 - 1, "n": 128}),
    _dumps({"model": "fake-model", "prompt": [[0]] * 100_000, "max_tokens": 2**31 - 1, "n": 128}),
    _dumps({"model": "x" * 100_000, "messages": [{"role": "user", "content": "hi"}]}),
    _dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": [{}] * 50_000}),
]


@pytest.mark.parametrize("raw", SPECIAL, ids=range(len(SPECIAL)))
async def test_special_bodies(secret, raw):
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert_not_a_failure(await _send(path, raw, secret), raw[:200])
