"""End to end: the official `openai` client's Responses API → the gateway (uvicorn) → a real SmolLM2
worker: text, streaming, continuation, a named function call and its output, a JSON-schema answer,
retrieve and delete, each metered once with the worker's own counts."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.dataplane.worker.process import MODEL, running

from . import sink
from .conftest import serving_gateway

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]

INSTRUCTIONS = "You are a concise assistant for the Tessera test suite. " * 8  # long enough to fill cache blocks
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def real_worker():
    with running() as worker:
        yield worker


@pytest.fixture
def client(real_worker, gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=100, key_fields={"allowed_adapters": ["none"]})
    with serving_gateway(gateway, real_worker) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120)


def wait_events(n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(sink.EVENTS) < n:
        assert time.monotonic() < deadline, f"{len(sink.EVENTS)} of {n} usage events"
        time.sleep(0.05)


def test_text_stream_and_continuation(client):
    first = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Name a colour.",
                                    max_output_tokens=8, temperature=0)
    assert first.output_text and 1 <= first.usage.output_tokens <= 8 and first.status in ("completed", "incomplete")
    with client.responses.stream(model=MODEL, instructions=INSTRUCTIONS, input="Name a colour.",
                                 max_output_tokens=8, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        streamed = stream.get_final_response()
    assert "".join(deltas) == streamed.output_text == first.output_text  # greedy: the same text, streamed
    assert streamed.usage.input_tokens_details.cached_tokens > 0  # same tenant, same worker: prefix reused

    follow = client.responses.create(model=MODEL, input="And another one?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    alone = client.responses.create(model=MODEL, input="And another one?", max_output_tokens=1, store=False)
    # The stored turn (question and answer, not the instructions) went back into the prompt.
    assert follow.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens + 3
    assert follow.usage.input_tokens < first.usage.input_tokens and follow.output_text
    assert client.responses.retrieve(follow.id).output_text == follow.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)

    wait_events(4)
    by_id = {e.request_id: e for e in sink.EVENTS}
    for response in (first, streamed, follow):
        event = by_id["req_" + response.id.removeprefix("resp_")]
        assert (event.status, event.prompt_tokens, event.completion_tokens) == (
            "ok", response.usage.input_tokens, response.usage.output_tokens)


def test_named_function_call_then_its_output(client):
    response = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                       tool_choice={"type": "function", "name": "get_weather"},
                                       max_output_tokens=40, temperature=0)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert call.call_id and call.id.startswith("fc_")

    answer = client.responses.create(
        model=MODEL, previous_response_id=response.id, max_output_tokens=16, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 18}'}])
    assert answer.output_text and answer.output[0].type == "message"

    events = list(client.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER], stream=True,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=40, temperature=0))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert pieces == done.arguments and isinstance(json.loads(done.arguments)["city"], str)
    assert events[-1].response.output[0].type == "function_call"


def test_json_schema_answer(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    response = client.responses.create(model=MODEL, input="Pick a colour.", max_output_tokens=30, temperature=0,
                                       text={"format": {"type": "json_schema", "name": "pick", "schema": schema,
                                                        "strict": True}})
    assert json.loads(response.output_text)["colour"] in ("red", "green", "blue")
    assert response.text.format.type == "json_schema"


def test_agent_loop_with_tool_choice_omitted(client):
    """tool_choice omitted is "auto": the model decides. Whatever it does comes back as Responses items
    (a call's arguments are valid JSON for the tool: the worker holds an opened call to the schema),
    and a call's output continues the loop from the stored response."""
    ask = {"model": MODEL, "tools": [WEATHER], "max_output_tokens": 60, "temperature": 0,
           "instructions": "Use the get_weather tool to answer questions about the weather."}
    response = client.responses.create(input="What is the weather in Paris right now?", **ask)
    assert response.status in ("completed", "incomplete")
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        assert call.name == "get_weather" and isinstance(json.loads(call.arguments), dict)
    if calls:
        response = client.responses.create(
            previous_response_id=response.id, **ask,
            input=[{"type": "function_call_output", "call_id": c.call_id, "output": '{"celsius": 18}'} for c in calls])
    assert response.output and response.usage.output_tokens > 0

    events = list(client.responses.create(input="What is the weather in Paris right now?", stream=True, **ask))
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [item.type for item in final.output] == [item.type for item in
                                                    client.responses.retrieve(final.id).output]
    if calls:  # greedy: the streamed answer makes the same call
        assert final.output[-1].type == "function_call" and final.output[-1].arguments == calls[-1].arguments
