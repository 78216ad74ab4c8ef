"""The worker's HTTP layer against a scripted engine: schemas, errors, streaming, admission, metrics."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from dataplane.errors import QueueFullError
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app

from .fakes import FakeEngine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def make(token: str = "", **engine_kw) -> tuple[FakeEngine, WorkerState, httpx.AsyncClient]:
    engine = FakeEngine(**engine_kw)
    state = WorkerState(WorkerConfig(model="fake", token=token, max_n=4, default_max_tokens=5), engine)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")
    return engine, state, client


def sse(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[6:]
            out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


async def test_chat_response_usage_and_gateway_headers():
    engine, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, "priority": 0},
                          headers={"X-Request-Id": "req_1", "X-Priority": "2", "X-Cache-Salt": "tenant-a"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req_1"
    body = r.json()
    assert body["id"] == "chatcmpl-req_1" and body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "abc", "refusal": None},
                                "logprobs": None, "finish_reason": "length"}]
    prompt = len("<user>hi<assistant>")
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3,
                             "prompt_tokens_details": {"cached_tokens": prompt // 2}}
    call = engine.calls[0]
    # The gateway's priority wins over the body's more urgent one; the salt keys the prefix cache.
    assert (call.request_id, call.priority, call.cache_salt) == ("req_1", 2, "tenant-a")


async def test_body_priority_can_only_lower_the_gateways():
    engine, _, client = make()
    await client.post("/v1/chat/completions", json={**CHAT, "priority": 7}, headers={"X-Priority": "2"})
    await client.post("/v1/chat/completions", json={**CHAT, "priority": 3})
    assert [c.priority for c in engine.calls] == [7, 3]


async def test_chat_stream_role_first_then_content_then_usage_and_done():
    _, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                        "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]] == ["b", "c"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "chat.completion.chunk" and "usage" in c for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


async def test_stream_without_include_usage_has_no_usage_chunk():
    _, _, client = make()
    r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True})
    events = sse(r.text)
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["a", "b"]
    assert all("usage" not in e for e in events[:-1])


async def test_completions_batch_n_and_logprobs_shape():
    _, _, client = make()
    r = await client.post("/v1/completions", json={"prompt": ["x", "yy"], "n": 2, "max_tokens": 2, "logprobs": 2})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    lp = body["choices"][3]["logprobs"]
    assert lp == {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.5],
                  "top_logprobs": [{"a": -0.5, "b": -1.5}, {"b": -0.5, "c": -1.5}], "text_offset": [0, 1]}
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 8


async def test_chat_logprobs_shape():
    _, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1, "logprobs": True, "top_logprobs": 2})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content == [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [
        {"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -1.5, "bytes": [98]}]}]


async def test_echo_prepends_the_prompt():
    _, _, client = make()
    r = await client.post("/v1/completions", json={"prompt": "xy", "max_tokens": 2, "echo": True})
    assert r.json()["choices"][0]["text"] == "xyab"
    r = await client.post("/v1/completions", json={"prompt": "xy", "max_tokens": 2, "echo": True, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in sse(r.text)[:-1]) == "xyab"


@pytest.mark.parametrize("body,param,code", [
    (b"{not json", None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    (orjson.dumps({**CHAT, "temperature": "0.5"}), "temperature", "invalid_type"),
    (orjson.dumps({**CHAT, "n": 1.5}), "n", "invalid_type"),
    (orjson.dumps({**CHAT, "messages": [{"role": "user", "content": 5}]}), "messages[0].content", "invalid_type"),
    (orjson.dumps({"model": "fake", "max_tokens": 1}), "messages", "missing_required_parameter"),
    (orjson.dumps({**CHAT, "messages": []}), "messages", "invalid_value"),
    (orjson.dumps({**CHAT, "temperature": -1}), "temperature", "invalid_value"),
    (orjson.dumps({**CHAT, "top_p": 0}), "top_p", "invalid_value"),
    (orjson.dumps({**CHAT, "max_tokens": 0}), "max_tokens", "invalid_value"),
    (orjson.dumps({**CHAT, "n": 5}), "n", "invalid_value"),
    (orjson.dumps({**CHAT, "max_tokens": 60}), "messages", "context_length_exceeded"),
    (orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 70}], "max_tokens": None}), "messages",
     "context_length_exceeded"),
    (orjson.dumps({**CHAT, "top_logprobs": 2}), "top_logprobs", "invalid_value"),
    (orjson.dumps({**CHAT, "tools": [{"type": "function"}]}), "tools[0]", "invalid_value"),
    (orjson.dumps({**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "required"}),
     "tools[0].function.name", "invalid_value"),
    (orjson.dumps({**CHAT, "tools": [TOOL]}), "tool_choice", "unsupported_parameter"),  # 'auto': no parser here
    (orjson.dumps({**CHAT, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
     "tool_choice", "invalid_value"),
    (orjson.dumps({**CHAT, "tool_choice": "required"}), "tool_choice", "invalid_value"),
    (orjson.dumps({**CHAT, "tools": [TOOL, TOOL], "tool_choice": "required"}), "tools", "invalid_value"),
    (orjson.dumps({**CHAT, "tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}),
     "response_format", "invalid_value"),
    (orjson.dumps({**CHAT, "logit_bias": {"one": 5}}), "logit_bias", "invalid_value"),
    (orjson.dumps({**CHAT, "logit_bias": {"1": 500}}), "logit_bias", "invalid_value"),
    (orjson.dumps({**CHAT, "response_format": {"type": "yaml"}}), "response_format.type", "invalid_value"),
    (orjson.dumps({**CHAT, "response_format": {"type": "json_schema"}}), "response_format.json_schema",
     "invalid_value"),
    (orjson.dumps({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}),
     "response_format.json_schema.schema", "invalid_value"),
    (orjson.dumps({**CHAT, "structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs",
     "invalid_value"),
    (orjson.dumps({**CHAT, "structured_outputs": {"whitespace_pattern": " "}}), "structured_outputs",
     "unsupported_parameter"),
    (orjson.dumps({**CHAT, "response_format": {"type": "json_object"}, "guided_choice": ["a"]}), "guided_choice",
     "invalid_value"),
    (orjson.dumps({**CHAT, "guided_json": "{oops"}), "guided_json", "invalid_value"),
    (orjson.dumps({**CHAT, "response_format": {"type": "json_object"}, "ignore_eos": True}), "ignore_eos",
     "invalid_value"),
    (orjson.dumps({**CHAT, "messages": [{"role": "assistant", "content": "refuse"}]}), "messages", "invalid_value"),
])
async def test_bad_chat_input_is_a_400_naming_the_field(body, param, code):
    engine, state, client = make()
    r = await client.post("/v1/chat/completions", content=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code), err
    assert not engine.calls or code == "invalid_value"  # nothing reached the engine's queue


@pytest.mark.parametrize("body,param,code", [
    ({"prompt": [], "max_tokens": 1}, "prompt", "invalid_type"),
    ({"prompt": [1, "a"], "max_tokens": 1}, "prompt", "invalid_type"),
    ({"max_tokens": 1}, "prompt", "missing_required_parameter"),
    ({"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1}, "n", "invalid_value"),
    ({"prompt": "a", "best_of": 3}, "best_of", "unsupported_parameter"),
])
async def test_bad_completion_input_is_a_400(body, param, code):
    _, _, client = make()
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code)


async def test_harmless_openai_fields_are_ignored_and_defaults_apply():
    engine, _, client = make()  # unknown fields are refused: tests/dataplane/worker/test_extension_fields.py
    r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "n": None, "metadata": {"x": "1"}, "stream": None})
    assert r.status_code == 200
    assert engine.calls[0].params.max_tokens == 5  # --default-max-tokens
    r = await client.post("/v1/completions", json={"prompt": "x"})
    assert engine.calls[1].params.max_tokens == 16  # OpenAI's default for completions


async def test_wrong_model_is_404():
    _, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_queue_full_is_429_with_retry_after_and_counted():
    _, _, client = make(fail=QueueFullError("3 requests are waiting (limit 3)"))
    for stream in (False, True):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
    metrics = (await client.get("/metrics")).text
    assert 'tessera:request_rejected_total{model_name="fake",reason="queue_full"} 2.0' in metrics


async def test_engine_failure_is_500_for_that_request_only():
    engine, _, client = make(error_at=0)
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 500
    engine.error_at = 1  # after the first token: reported in-band, no [DONE]
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = sse(r.text)
    assert r.status_code == 200 and events[-1]["error"]["code"] == "internal_error" and "[DONE]" not in events
    engine.error_at = None
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert 'finished_reason="error"' in metrics


async def test_worker_token_guards_everything_but_health():
    _, _, client = make(token="s3cret")
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/ready")).status_code == 200
    for path in ("/v1/models", "/metrics"):
        assert (await client.get(path)).status_code == 401
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200
    models = (await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})).json()
    assert models["data"][0]["id"] == "fake" and models["data"][0]["max_model_len"] == 64


async def test_draining_refuses_new_requests_and_readiness():
    _, state, client = make()
    state.drainer.draining = True
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining" and r.headers["retry-after"]
    ready = await client.get("/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert (await client.get("/health")).status_code == 200


async def test_dead_engine_fails_health():
    engine, _, client = make()
    engine.alive = False
    assert (await client.get("/health")).status_code == 503
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 503


async def test_metrics_names_and_labels():
    _, _, client = make()
    await client.post("/v1/chat/completions", json=CHAT, headers={"X-Priority": "1"})
    text = (await client.get("/metrics")).text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds"):
        assert f'tessera:{name}_count{{model_name="fake",priority="1"}} ' in text
    assert 'tessera:inter_token_latency_seconds_count{model_name="fake",priority="1"} 2.0' in text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "num_preemptions_total"):
        assert f'tessera:{name}{{model_name="fake"}} ' in text
    assert 'tessera:request_success_total{finished_reason="length",model_name="fake",priority="1"} 1.0' in text


async def test_colliding_request_ids_get_unique_engine_ids():
    engine, _, client = make(gate=asyncio.Event())
    headers = {"X-Request-Id": "same"}
    first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=headers))
    second = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=headers))
    while len(engine.calls) < 2:
        await asyncio.sleep(0.01)
    engine.gate.set()
    responses = await asyncio.gather(first, second)
    assert all(r.headers["x-request-id"] == "same" for r in responses)
    ids = [c.request_id for c in engine.calls]
    assert ids[0] == "same" and ids[1].startswith("same-") and len(set(ids)) == 2


@pytest.mark.parametrize("path,extra,want", [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}},
     ("json", '{"type":"object","properties":{"b":{},"a":{}}}', "response_format")),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, ("json_object", "True", "response_format")),
    ("/v1/chat/completions", {"response_format": {"type": "text"}}, None),
    ("/v1/completions", {"structured_outputs": {"choice": ["a", "b"]}}, ("choice", '["a", "b"]', "structured_outputs")),
    ("/v1/completions", {"guided_regex": "[0-9]+"}, ("regex", "[0-9]+", "guided_regex")),
    ("/v1/completions", {"guided_grammar": 'root ::= "x"'}, ("grammar", 'root ::= "x"', "guided_grammar")),
])
async def test_structured_output_fields_reach_the_engine(path, extra, want):
    engine, _, client = make()
    body = {**CHAT, **extra} if "chat" in path else {"model": "fake", "prompt": "hi", "max_tokens": 2, **extra}
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    spec = engine.calls[0].params.structured
    assert (spec is None if want is None else (*spec.key, spec.source) == want)
    metrics = (await client.get("/metrics")).text
    kind = want[0] if want else ""
    counted = f'tessera:structured_output_requests_total{{kind="{kind}",model_name="fake"}} 1.0'
    assert (counted in metrics) == (want is not None)
    assert ("structured_output_requests_total{" in metrics) == (want is not None)


async def test_logit_bias_reaches_the_engine_as_token_ids():
    engine, _, client = make()
    r = await client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 2,
                                                   "logit_bias": {"7": -100, "42": 3}})
    assert r.status_code == 200, r.text
    assert engine.calls[0].params.logit_bias == {7: -100, 42: 3}
