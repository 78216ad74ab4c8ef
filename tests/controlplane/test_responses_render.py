"""Chat answers rendered as Responses objects and events, in the shapes the worker sends for
tool_choice "auto" (text, then calls; parallel calls by index) and for in-band errors."""

from __future__ import annotations

import json

from controlplane.gateway.responses import responses_render as render


def response() -> dict:
    return render.skeleton("resp_1", {"model": "m", "tools": [{"type": "function", "name": "f"}]}, store=True)


def events(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def chunk(delta: dict | None = None, finish: str | None = None, **extra) -> dict:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}


def test_text_then_two_parallel_calls_stream_as_items_in_order():
    writer = render.EventWriter(response())
    raw = writer.start()
    for obj in (chunk({"role": "assistant", "content": "Let me check. "}),
                chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                       "function": {"name": "f", "arguments": ""}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}),
                chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                       "function": {"name": "f", "arguments": '{"x": 2}'}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
                chunk(finish="tool_calls"),
                {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 12,
                                          "prompt_tokens_details": {"cached_tokens": 4}}}):
        raw += writer.chat_event(obj)
    raw += writer.end()
    out = events(raw)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    added = [(e["output_index"], e["item"]["type"]) for e in out if e["type"] == "response.output_item.added"]
    assert added == [(0, "message"), (1, "function_call"), (2, "function_call")]
    args = [(e["output_index"], e["delta"]) for e in out if e["type"] == "response.function_call_arguments.delta"]
    assert args == [(1, '{"x": '), (2, '{"x": 2}'), (1, "1}")]
    done = {e["output_index"]: e["arguments"] for e in out if e["type"] == "response.function_call_arguments.done"}
    assert done == {1: '{"x": 1}', 2: '{"x": 2}'}
    final = out[-1]
    assert final["type"] == "response.completed" and final["response"]["status"] == "completed"
    items = final["response"]["output"]
    assert [i["status"] for i in items] == ["completed"] * 3
    assert (items[1]["call_id"], items[2]["call_id"]) == ("call_a", "call_b")
    assert final["response"]["usage"] == {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4},
                                          "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 0},
                                          "total_tokens": 21}
    # What a continuation sends back: the text turn, then both calls (one assistant turn with two tool_calls).
    assert render.output_items_for_context(items) == [
        {"type": "message", "role": "assistant", "content": "Let me check. ", "id": items[0]["id"]},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": '{"x": 1}', "id": items[1]["id"]},
        {"type": "function_call", "call_id": "call_b", "name": "f", "arguments": '{"x": 2}', "id": items[2]["id"]}]


def test_an_in_band_error_fails_the_response():
    writer = render.EventWriter(response())
    raw = writer.start() + writer.chat_event(chunk({"content": "par"}))
    raw += writer.chat_event({"error": {"message": "engine died", "type": "server_error", "code": "engine_error"}})
    out = events(raw + writer.end())
    assert [e["type"] for e in out[-3:]] == ["response.output_item.done", "error", "response.failed"]
    assert out[-1]["response"]["error"] == {"code": "engine_error", "message": "engine died"}
    assert out[-1]["response"]["output"][0]["status"] == "incomplete"


def test_a_buffered_tool_call_answer():
    completion = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_z", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    out = render.from_chat(response(), completion)
    assert out["status"] == "completed" and [i["type"] for i in out["output"]] == ["function_call"]
    assert out["output"][0]["call_id"] == "call_z" and out["usage"]["input_tokens_details"] == {"cached_tokens": 0}
