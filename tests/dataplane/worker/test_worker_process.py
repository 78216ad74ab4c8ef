"""A real worker process serving SmolLM2, driven by the official `openai` client."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from .process import MODEL, TOKEN, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.model]

CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def worker():
    w = WorkerProcess()
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def client(worker) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)


def test_chat_and_completion(client):
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert chat.usage.prompt_tokens > 10 and 1 <= chat.usage.completion_tokens <= 8
    assert chat.usage.prompt_tokens_details.cached_tokens >= 0

    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert done.choices[0].text.strip().startswith("Paris")
    assert done.usage.completion_tokens == 4 and done.choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list()] == [MODEL]


def test_stream_matches_whole_response_and_ends_with_usage(client):
    kwargs = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # Flushed per token: one chunk per generated token here (plain ASCII text, no stop strings).
    assert len([c for c in chunks if c.choices]) == whole.usage.completion_tokens


def test_stop_string_ends_the_completion(client):
    done = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=10, temperature=0, stop=[","])
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].text.strip() == "6"


def test_n2_seed_reproducibility(client):
    kwargs = {"model": MODEL, "messages": CHAT, "max_tokens": 10, "temperature": 1.0, "n": 2}
    first = client.chat.completions.create(**kwargs, seed=1234)
    again = client.chat.completions.create(**kwargs, seed=1234)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    other = client.chat.completions.create(**kwargs, seed=99)
    assert [c.message.content for c in other.choices] != [c.message.content for c in first.choices]


def test_logprobs_in_both_shapes(client):
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
                                          top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert "".join(t.token for t in content if t.token != "<|im_end|>") == chat.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob == t.top_logprobs[0].logprob <= 0  # greedy: the top one
        assert bytes(t.bytes).decode() == t.token
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                     logprobs=2)
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and len(lp.token_logprobs) == 3
    assert lp.text_offset == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]
    assert all(len(top) == 2 for top in lp.top_logprobs)


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_structured_outputs_through_the_openai_client(client):
    messages = [{"role": "user", "content": "Describe Ana, who is 31."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                          response_format=fmt)
    assert chat.choices[0].finish_reason == "stop"
    person = json.loads(chat.choices[0].message.content)
    assert list(person) == ["name", "age"] and isinstance(person["age"], int)

    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                            response_format={"type": "json_object"}, stream=True)
    assert isinstance(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), dict)

    done = client.completions.create(model=MODEL, prompt="The year the war ended:", max_tokens=8, temperature=0,
                                     extra_body={"structured_outputs": {"regex": "[12][0-9]{3}"}})
    assert re.fullmatch("[12][0-9]{3}", done.choices[0].text) and done.choices[0].finish_reason == "stop"
    picked = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                            extra_body={"guided_choice": ["young", "old"]})
    assert picked.choices[0].message.content in ("young", "old")


@pytest.mark.parametrize("kwargs,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"extra_body": {"structured_outputs": {"regex": "(unclosed"}}}, "structured_outputs"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
])
def test_bad_structured_outputs_are_400s(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, **kwargs)
    assert err.value.code == "invalid_value" and err.value.body["param"] == param


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 30},
                                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                                               "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}}, "required": ["timezone"]}}}


def test_tool_calls_through_the_openai_client(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                           tools=[WEATHER, CLOCK],
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = named.choices[0].message
    assert msg.content is None and len(msg.tool_calls) == 1 and msg.tool_calls[0].function.name == "get_weather"
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")

    required = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=80, temperature=0,
                                              tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False)
    assert required.choices[0].finish_reason == "tool_calls"
    (only,) = required.choices[0].message.tool_calls
    assert only.function.name in ("get_weather", "get_time") and isinstance(json.loads(only.function.arguments), dict)

    # Streamed: the id and name first, then argument pieces that join into the whole response's arguments.
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                                 tools=[WEATHER], stream=True,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == msg.tool_calls[0].function.arguments

    # The next turn: the assistant's call and the tool's answer go back in as OpenAI shapes them.
    follow = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, tools=[WEATHER],
                                            tool_choice="none", messages=[
        *messages, {"role": "assistant", "content": None, "tool_calls": [msg.tool_calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"temperature": 18}'}])
    assert follow.choices[0].message.content and not follow.choices[0].message.tool_calls

    # No tool_choice: 'auto', read by the hermes parser this ChatML model gets (tests/dataplane/worker/test_tool_*).
    auto = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, tools=[WEATHER])
    assert auto.choices[0].message.content or auto.choices[0].message.tool_calls


def test_logit_bias_through_the_openai_client(client):
    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    comma = Tokenizer.from_gguf(resolve_model_path(MODEL), (2,)).encode(",")[-1]
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                     logit_bias={str(comma): 100})
    assert done.choices[0].text == ",,,"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, logit_bias={"10000000": 1})
    assert err.value.body["param"] == "logit_bias"


def test_prefix_cache_is_shared_within_a_salt_only(worker, client):
    prompt = "A tenant's long shared system prompt about gardening, composting and soil. " * 6
    def cached(salt: str) -> int:
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_headers={"X-Cache-Salt": salt})
        return done.usage.prompt_tokens_details.cached_tokens
    assert cached("tenant-a") == 0
    assert cached("tenant-a") >= 64
    assert cached("tenant-b") == 0


@pytest.mark.parametrize("kwargs,code,param", [
    ({"max_tokens": 100_000}, "context_length_exceeded", "messages"),
    ({"temperature": -1}, "invalid_value", "temperature"),
    ({"temperature": "hot"}, "invalid_type", "temperature"),
    ({"n": 1000}, "invalid_value", "n"),
    ({"top_logprobs": 50, "logprobs": True}, "invalid_value", "logprobs"),
])
def test_bad_requests_are_400s_with_a_code(client, kwargs, code, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, **kwargs)
    assert err.value.code == code and err.value.body["param"] == param


def test_wrong_token_is_401(worker):
    bad = openai.OpenAI(base_url=worker.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_request_id_is_echoed(client):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=1,
                                                           extra_headers={"X-Request-Id": "req_e2e"})
    assert raw.headers["x-request-id"] == "req_e2e" and raw.parse().id == "chatcmpl-req_e2e"


def test_disconnect_mid_stream_frees_the_requests_blocks(worker):
    before = worker.metrics()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", worker.url + "/v1/completions", json=body, headers=worker.headers, timeout=60) as r:
        lines = r.iter_lines()  # held: a collected line iterator would close the response
        events = 0
        for line in lines:
            events += line.startswith("data: ")
            if events == 3:
                break
        during = worker.metrics()
        assert during["tessera:num_requests_running"] == 1 and during["tessera:kv_cache_usage_perc"] > 0
    left = time.monotonic()
    worker.wait_metric("tessera:num_requests_running", lambda v: v == 0, timeout=5)
    assert time.monotonic() - left < 2
    after = worker.metrics()
    assert after["tessera:kv_cache_usage_perc"] == 0
    assert after["tessera:generation_tokens_total"] - before["tessera:generation_tokens_total"] < 100
    abort = 'tessera:request_success_total{finished_reason="abort",model_name="smollm2-135m-instruct",priority="0"}'
    assert after.get(abort, 0) == before.get(abort, 0) + 1
    assert after["tessera:time_to_first_token_seconds_count"] > 0


def test_a_gateway_that_leaves_mid_stream_reads_the_final_count_over_http(worker):
    """The gateway's view of a partial stream: cumulative counts on each event, then — right after it
    drops the connection — the usage route with `wait` gives the final figure of the aborted request."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = {**worker.headers, "X-Request-Id": "req_gone", "X-Tessera-Accounting": "1"}
    frames = []
    with httpx.stream("POST", worker.url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        lines = r.iter_lines()  # held: a collected line iterator would close the response
        for line in lines:
            if line.startswith(": usage "):
                frames.append(json.loads(line[len(": usage "):]))
            elif line.startswith("data: ") and len(frames) == 3:
                break
    usage = worker.url + "/tessera/v1/requests/{}/usage"
    answer = httpx.get(usage.format("req_gone"), params={"wait": 5}, headers=worker.headers, timeout=10).json()
    assert (answer["request_id"], answer["state"], answer["status"]) == ("req_gone", "finished", "cancelled")
    assert frames[-1]["completion_tokens"] >= 3 and frames[-1]["prompt_tokens"] == answer["prompt_tokens"] == 4
    assert frames[-1]["completion_tokens"] <= answer["completion_tokens"] < 400
    unknown = httpx.get(usage.format("never-sent"), headers=worker.headers, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "request_not_found"
    assert httpx.get(usage.format("req_gone"), timeout=10).status_code == 401
