"""An agent loop with `tool_choice` omitted: the official `openai` client → the gateway → a real
SmolLM2 worker (hermes parser, the shipped ChatML tool template, calls constrained once opened).

SmolLM2-135M answers a weather question in prose rather than calling a tool, so the first turn
nudges it with `logit_bias` on the tokens of `<tool_call>` (what a client may send); with every
one of them at +100 the unconstrained model would only repeat them, so a well-formed call here is
the constraint's doing. The later turns carry no bias: the model decides, and answers in text.
"""

from __future__ import annotations

import json

import openai
import pytest

from dataplane.models.registry import resolve_model_path
from dataplane.models.tokenizer import Tokenizer
from tests.dataplane.worker.process import MODEL, running

from .conftest import serving_gateway

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def real_worker():
    with running() as worker:
        yield worker


@pytest.fixture
def client(real_worker, gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=100, key_fields={"allowed_adapters": ["none"]})
    with serving_gateway(gateway, real_worker) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120)


def _nudge() -> dict[str, int]:
    tok = Tokenizer.from_gguf(resolve_model_path(MODEL), (2,))
    return {str(t): 100 for t in tok.hf.encode("<tool_call>", add_special_tokens=False)}


def test_agent_loop_with_tool_choice_omitted(client):
    assert {m.id for m in client.models.list()} >= {MODEL}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    bias = _nudge()

    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=60,
                                           temperature=0, logit_bias=bias, parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.function.name == "get_weather" and tc.id.startswith("call_")
    args = json.loads(tc.function.arguments)
    assert set(args) == {"city"} and args["city"] in {"Paris", "Rome", "Tokyo"}

    # Streamed, the same call: its id and name first (arguments ""), then the arguments in pieces, then the reason.
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=60,
                                                  temperature=0, logit_bias=bias, parallel_tool_calls=False,
                                                  stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
    assert all(d.index == 0 for d in deltas)
    streamed_args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(streamed_args) == json.loads(tc.function.arguments)  # the model's own text, as it wrote it
    assert len([d for d in deltas if d.function.arguments]) > 1  # in pieces, not one at the end
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # The tool's result and the earlier call go back through the template; no bias: the model answers.
    messages += [{"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
                 {"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"city": args["city"], "celsius": 18})}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=40,
                                            temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered

    # Streamed text answer with tools offered: content deltas, no tool calls.
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=40,
                                                    temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == answer.choices[0].message.content
    assert not any(c.choices[0].delta.tool_calls for c in streamed if c.choices)


def test_a_call_cut_off_at_max_tokens_comes_back_as_content(client):
    # Parallel calls on: after the first call the nudged model keeps opening calls until max_tokens;
    # the complete ones are calls, the one cut off comes back as content, and the reason is "length".
    res = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}],
                                         tools=[WEATHER], max_tokens=40, temperature=0, logit_bias=_nudge())
    msg = res.choices[0].message
    assert res.choices[0].finish_reason == "length"
    assert msg.tool_calls and all(json.loads(c.function.arguments)["city"] in {"Paris", "Rome", "Tokyo"}
                                  for c in msg.tool_calls)
    assert msg.content and msg.content.lstrip().startswith("<tool_call>")
