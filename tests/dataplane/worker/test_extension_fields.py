"""Fields the worker does not implement are refused by name, never silently dropped; the
`response_format: {"type": "json_object", "schema": ...}` convention constrains to the schema."""

from __future__ import annotations

import json

import pytest

from .test_routes import CHAT, make

COMPLETION = {"model": "fake", "prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "something_new": {"x": 1}}, "something_new"),
    ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions"),  # legacy function calling
    ("/v1/chat/completions", {**CHAT, "function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {**CHAT, "audio": {"voice": "alloy"}}, "audio"),
    ("/v1/chat/completions", {**CHAT, "web_search_options": {}}, "web_search_options"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 5}, "min_tokens"),  # vLLM's, not implemented here
    ("/v1/chat/completions", {**CHAT, "modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {**CHAT, "verbosity": "low"}, "verbosity"),
    ("/v1/completions", {**COMPLETION, "use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {**COMPLETION, "top_logprobs": 3}, "top_logprobs"),  # a chat field, not completions'
    ("/v1/chat/completions", {**CHAT, "zzz": 1, "aaa": 2}, "aaa"),  # several: the first named, all listed
])
async def test_unknown_fields_are_a_400_naming_them(path, body, param):
    engine, _, client = make()
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, "unsupported_parameter")
    assert param in err["message"]
    assert not engine.calls


async def test_every_unknown_field_is_listed():
    _, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, "zzz": 1, "aaa": 2})
    assert "aaa" in r.json()["error"]["message"] and "zzz" in r.json()["error"]["message"]


@pytest.mark.parametrize("extra", [
    {"metadata": {"k": "v"}}, {"store": True}, {"service_tier": "auto"}, {"prompt_cache_key": "p"},
    {"safety_identifier": "u1"}, {"modalities": ["text"]}, {"reasoning_effort": "low"},
    {"prediction": {"type": "content", "content": "x"}}, {"user": "u1"},
])
async def test_fields_that_cannot_change_the_answer_are_accepted(extra):
    engine, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text
    assert len(engine.calls) == 1


async def test_json_object_with_a_schema_constrains_to_the_schema():
    engine, _, client = make()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        r = await client.post(path, json={**body, "response_format": {"type": "json_object", "schema": schema}})
        assert r.status_code == 200, r.text
        spec = engine.calls[-1].params.structured
        assert json.loads(spec.json) == schema and not spec.json_object  # the schema, not any JSON object
    r = await client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}})
    assert engine.calls[-1].params.structured.json_object


@pytest.mark.parametrize("fmt,param", [
    ({"type": "json_object", "schema": "not an object"}, "response_format.schema"),
    ({"type": "json_object", "json_schema": {"name": "x", "schema": {}}}, "response_format.json_schema"),
    ({"type": "text", "schema": {}}, "response_format.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
     "response_format.json_schema.extra"),
])
async def test_response_format_keys_its_type_does_not_take_are_refused(fmt, param):
    engine, _, client = make()
    r = await client.post("/v1/chat/completions", json={**CHAT, "response_format": fmt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not engine.calls


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {**COMPLETION, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {**COMPLETION, "prompt_logprobs": 21}, "prompt"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),  # 0 only scores: needs prompt logprobs
    ("/v1/completions", {**COMPLETION, "max_tokens": 0, "echo": True, "logprobs": 0, "n": 2}, "n"),
])
async def test_prompt_logprobs_misuse_is_a_400(path, body, param):
    engine, _, client = make()
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in (param, "prompt_logprobs"), r.json()


async def test_prompt_logprobs_reach_the_engine():
    engine, _, client = make()
    await client.post("/v1/completions", json={**COMPLETION, "echo": True, "logprobs": 2})
    await client.post("/v1/completions", json={**COMPLETION, "echo": True, "logprobs": 1, "prompt_logprobs": 4})
    await client.post("/v1/chat/completions", json={**CHAT, "prompt_logprobs": 0})
    await client.post("/v1/completions", json={**COMPLETION, "echo": True})
    assert [c.params.prompt_logprobs for c in engine.calls] == [2, 4, 0, None]
