"""tool_choice auto in the renderer: OpenAI's shapes, whole and streamed, for calls, text and botched calls."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dataplane.worker.render import Choice, Renderer, TokenText
from dataplane.worker.tool_parsers import get_parser
from dataplane.worker.tools import parse_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _renderer(parallel: bool = True) -> Renderer:
    mode = parse_tools([WEATHER], None, parallel, get_parser("hermes"))
    tok = SimpleNamespace(backend=SimpleNamespace(decoder=None), decode=lambda ids, **_: "", id_to_token=str)
    return Renderer(chat=True, response_id="chatcmpl-1", created=0, model="m", include_usage=False, logprobs=False,
                    text=TokenText(tok), tools=mode)


def _whole(text: str, reason: str = "stop", parallel: bool = True) -> dict:
    c = Choice(0, text=[text], finish_reason=reason)
    return json.loads(_renderer(parallel).response([c], {}, None, 1))["choices"][0]


def _streamed(text: str, size: int, reason: str = "stop") -> list[dict]:
    r, c = _renderer(), Choice(0)
    pieces = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    out = []
    for k, piece in enumerate(pieces):
        out += r.chunks(c, piece, None, reason if k == len(pieces) - 1 else None)
    return out


def test_a_call_whole():
    choice = _whole("Sure. " + CALL)
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Sure." and msg["role"] == "assistant"
    (tc,) = msg["tool_calls"]
    assert tc["type"] == "function" and tc["id"].startswith("call_")
    assert tc["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_text_whole_has_no_tool_calls_and_a_cut_call_is_content():
    assert _whole("It is sunny.") == {"index": 0, "message": {"role": "assistant", "content": "It is sunny.",
                                                              "refusal": None}, "logprobs": None,
                                      "finish_reason": "stop"}
    cut = _whole(CALL[:30], "length")
    assert cut["finish_reason"] == "length" and cut["message"]["content"] == CALL[:30]
    assert "tool_calls" not in cut["message"]


def test_parallel_false_answers_the_first_call_and_keeps_the_second_as_content():
    choice = _whole(CALL + "\n" + CALL, parallel=False)
    assert len(choice["message"]["tool_calls"]) == 1 and choice["message"]["content"] == "\n" + CALL


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_streamed_text_then_two_calls(size):
    chunks = _streamed("Let me check. " + CALL + "\n" + CALL.replace("Paris", "Rome"), size)
    assert chunks[0]["delta"]["role"] == "assistant"
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "Let me check."
    calls = [tc for c in chunks for tc in c["delta"].get("tool_calls", [])]
    heads = [tc for tc in calls if "id" in tc]
    assert [(h["index"], h["function"]["name"], h["function"]["arguments"]) for h in heads] == \
        [(0, "get_weather", ""), (1, "get_weather", "")]
    assert len({h["id"] for h in heads}) == 2
    args = {i: "".join(tc["function"]["arguments"] for tc in calls if tc["index"] == i) for i in (0, 1)}
    assert args == {0: '{"city": "Paris"}', 1: '{"city": "Rome"}'}
    assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]
    # the id and name come before any of that call's arguments
    first_args = next(k for k, c in enumerate(chunks) if any(tc.get("function", {}).get("arguments")
                                                              for tc in c["delta"].get("tool_calls", [])))
    assert any("id" in tc for c in chunks[:first_args] for tc in c["delta"].get("tool_calls", []))


def test_streamed_botched_call_is_content_and_stop():
    botched = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    chunks = _streamed(botched, 4)
    assert "".join(c["delta"].get("content") or "" for c in chunks) == botched
    assert not any("tool_calls" in c["delta"] for c in chunks) and chunks[-1]["finish_reason"] == "stop"


def test_streamed_constrained_call_sends_its_arguments_in_pieces_as_they_are_written():
    """Under the grammar (the default) a call is a call once opened: its id and name go out at its head,
    then its arguments piece by piece, joining to exactly the JSON text the model wrote."""
    nested = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "when": {"day": 1}}}\n</tool_call>'
    chunks = _streamed(nested, 3)
    calls = [tc for c in chunks for tc in c["delta"].get("tool_calls", [])]
    assert "id" in calls[0] and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    pieces = [tc["function"]["arguments"] for tc in calls[1:]]
    assert len(pieces) > 5 and all(pieces) and all(tc["index"] == 0 and "id" not in tc for tc in calls[1:])
    assert "".join(pieces) == '{"city": "Paris", "when": {"day": 1}}'
    assert json.loads("".join(pieces)) == {"city": "Paris", "when": {"day": 1}}
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_streamed_constrained_call_cut_by_max_tokens_keeps_what_was_written_and_says_length():
    chunks = _streamed(CALL[:55], 4, reason="length")
    calls = [tc for c in chunks for tc in c["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"]["arguments"] for tc in calls) == CALL[CALL.index("{\"city"):55]
    assert not "".join(c["delta"].get("content") or "" for c in chunks)  # never both a call and its text
    assert chunks[-1]["finish_reason"] == "length"


def test_unconstrained_streams_a_call_whole_once_it_parses():
    mode = parse_tools([WEATHER], None, True, get_parser("hermes"), constrained=False)
    tok = SimpleNamespace(backend=SimpleNamespace(decoder=None), decode=lambda ids, **_: "", id_to_token=str)
    r, c = Renderer(chat=True, response_id="c", created=0, model="m", include_usage=False, logprobs=False,
                    text=TokenText(tok), tools=mode), Choice(0)
    out = []
    for i in range(0, len(CALL), 3):
        out += r.chunks(c, CALL[i:i + 3], None, "stop" if i + 3 >= len(CALL) else None)
    calls = [tc for ch in out for tc in ch["delta"].get("tool_calls", [])]
    assert [tc["function"]["arguments"] for tc in calls] == ["", '{"city": "Paris"}']  # head, then all at once
