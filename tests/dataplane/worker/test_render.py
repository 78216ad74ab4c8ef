from __future__ import annotations

import json
from types import SimpleNamespace

import orjson
import pytest
from tokenizers.decoders import ByteLevel

from dataplane.worker.render import Choice, Renderer, TokenText, _byte_decoder
from dataplane.worker.tools import parse_tools


def test_byte_level_alphabet_covers_every_byte_once():
    table = _byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["a"] == 0x61


def test_token_text_gives_exact_bytes_and_escapes_partial_characters():
    pieces = {1: "ĠHello", 2: "Ġæ", 3: "<|im_end|>"}
    tok = SimpleNamespace(backend=SimpleNamespace(decoder=ByteLevel()), id_to_token=pieces.__getitem__)
    text = TokenText(tok)
    assert text(1) == (" Hello", list(b" Hello"))
    assert text(2) == (" \\xe6", [0x20, 0xE6])  # half of a character: shown as OpenAI does
    assert text(3) == ("<|im_end|>", list(b"<|im_end|>"))


# -- tool calls ----------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def _renderer(mode) -> Renderer:
    tok = SimpleNamespace(backend=SimpleNamespace(decoder=None), decode=lambda ids, **_: "", id_to_token=str)
    return Renderer(chat=True, response_id="chatcmpl-1", created=0, model="m", include_usage=False, logprobs=False,
                    text=TokenText(tok), tools=mode)


def test_named_call_streams_its_arguments_after_the_id_and_name():
    r = _renderer(parse_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}, None))
    c = Choice(0)
    pieces = ['{"city": ', '"Paris"', "}"]
    chunks = [r.chunk(c, p, None, None) for p in pieces] + [r.chunk(c, "", None, "stop")]
    first = chunks[0]["delta"]
    assert first["role"] == "assistant" and first["content"] is None
    call = first["tool_calls"][0]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": '}
    args = "".join(ch["delta"]["tool_calls"][0]["function"]["arguments"] for ch in chunks[:3])
    assert json.loads(args) == {"city": "Paris"}
    assert all("id" not in ch["delta"]["tool_calls"][0] for ch in chunks[1:3])
    assert chunks[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


def test_required_calls_are_sent_whole_at_the_end():
    mode = parse_tools([WEATHER, TIME], "required", None)
    r = _renderer(mode)
    c = Choice(0)
    answer = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {}}]'
    head = r.chunk(c, answer[:10], None, None)
    assert head["delta"] == {"role": "assistant", "content": None}
    assert r.chunk(c, answer[10:], None, None) is None  # nothing the client can use until the array closes
    end = r.chunk(c, "", None, "stop")
    assert end["finish_reason"] == "tool_calls"
    calls = end["delta"]["tool_calls"]
    assert [(x["index"], x["function"]["name"], json.loads(x["function"]["arguments"])) for x in calls] == [
        (0, "get_weather", {"city": "Oslo"}), (1, "get_time", {})]
    assert len({x["id"] for x in calls}) == 2


@pytest.mark.parametrize("choice,text,reason,want_reason,want_calls", [
    ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Rome"}', "stop", "stop",
     [("get_weather", {"city": "Rome"})]),
    ("required", '[{"name": "get_time", "parameters": {}}]', "stop", "tool_calls", [("get_time", {})]),
    ("required", '[{"name": "get_wea', "length", "length", None),  # cut short: the raw text, no calls
])
def test_whole_responses_carry_tool_calls(choice, text, reason, want_reason, want_calls):
    r = _renderer(parse_tools([WEATHER, TIME], choice, None))
    c = Choice(0, text=[text], finish_reason=reason)
    body = orjson.loads(r.response([c], {}, None, 1))
    (out,) = body["choices"]
    assert out["finish_reason"] == want_reason
    if want_calls is None:
        assert out["message"]["content"] == text and "tool_calls" not in out["message"]
    else:
        assert out["message"]["content"] is None
        assert [(x["function"]["name"], json.loads(x["function"]["arguments"])) for x in out["message"]["tool_calls"]] \
            == want_calls


def test_required_schema_allows_each_tool_once_per_item_and_one_item_without_parallel_calls():
    one = parse_tools([WEATHER, TIME], "required", False).structured()
    schema = json.loads(one.json)
    assert schema["maxItems"] == 1 and schema["minItems"] == 1 and one.source == "tools"
    names = [alt["properties"]["name"]["const"] for alt in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    assert "maxItems" not in json.loads(parse_tools([WEATHER], "required", None).structured().json)
    assert parse_tools([WEATHER], "none", None) is None and parse_tools(None, None, None) is None
