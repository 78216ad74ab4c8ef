"""Chat-completions answers rendered as Responses API objects (responses_request.py sends the chat
request): a chat completion becomes a Response, a chat stream the Responses API's semantic events.

Output items: the assistant's text is one `message` item with one `output_text` part; each tool
call a `function_call` item whose `call_id` is the chat call's id (the client sends it back in a
`function_call_output`). `finish_reason: "length"` makes the response `incomplete`
(`max_output_tokens`); an in-band error makes it `failed`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from controlplane.gateway.sse import usage_counts


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    counts = usage_counts(chat_usage)
    if counts is None:
        return None
    prompt, cached, completion = counts
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def skeleton(response_id: str, body: dict[str, Any], *, store: bool) -> dict[str, Any]:
    """The Response object before any output: the request's settings, as OpenAI echoes them."""
    fmt = (body.get("text") or {}).get("format") or {"type": "text"}
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {}, "model": body["model"], "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"), "reasoning": None, "service_tier": "default",
        "store": store, "temperature": body.get("temperature", 1.0), "text": {"format": fmt},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": "disabled", "usage": None, "user": body.get("user"),
    }


def message_item(text: str, *, status: str = "completed", id_: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": id_ or item_id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call_id: str, name: str, arguments: str, *, status: str = "completed",
              id_: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": id_ or item_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def finish(response: dict[str, Any], finish_reason: str | None) -> None:
    if finish_reason == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["status"] = "completed"


def from_chat(response: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    """A buffered chat completion (one choice) as the Response's output, status and usage."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output = []
    if message.get("content"):
        output.append(message_item(message["content"]))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(call_item(call.get("id") or item_id("call"), function.get("name", ""),
                                function.get("arguments") or ""))
    response["output"] = output
    response["usage"] = usage(completion.get("usage"))
    finish(response, choice.get("finish_reason"))
    return response


ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as stored: each with an id of its own (input_items lists and pages by it)."""
    return [{**item, "id": item_id(ID_PREFIXES[item["type"]])} for item in items]


def output_items_for_context(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the normalized input items that continue the conversation (ids kept)."""
    items = []
    for item in output:
        if item["type"] == "message":
            items.append({"type": "message", "role": "assistant", "id": item["id"],
                          "content": "".join(part["text"] for part in item["content"])})
        else:
            items.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                          "arguments": item["arguments"], "id": item["id"]})
    return items


def input_item(item: dict[str, Any], position: int) -> dict[str, Any]:
    """A stored item as the input_items endpoint shows it."""
    shown = {"id": item.get("id") or f"item_{position}", "type": item["type"], "status": "completed"}
    if item["type"] == "message":
        part = "output_text" if item["role"] == "assistant" else "input_text"
        shown.update(role=item["role"], content=[{"type": part, "text": item["content"]}])
    elif item["type"] == "function_call":
        shown.update(call_id=item["call_id"], name=item["name"], arguments=item["arguments"])
    else:
        shown.update(call_id=item["call_id"], output=item["output"])
    return shown


class EventWriter:
    """Chat stream events in, Responses events out (as SSE bytes), with the final Response object
    built alongside (`response`)."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self.sequence = 0
        self.text_item: dict[str, Any] | None = None  # the open message item
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool_call index → open function_call item
        self.finish_reason: str | None = None
        self.error: dict[str, Any] | None = None

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def start(self) -> bytes:
        snapshot = dict(self.response, output=[])
        return self.event("response.created", response=snapshot) + self.event("response.in_progress", response=snapshot)

    def _add(self, item: dict[str, Any]) -> bytes:
        self.response["output"].append(item)
        return self.event("response.output_item.added", output_index=len(self.response["output"]) - 1, item=dict(item))

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, it in enumerate(self.response["output"]) if it is item)

    def chat_event(self, obj: dict[str, Any]) -> bytes:
        """One parsed chat stream payload → the Responses events it makes."""
        out = []
        if obj.get("error"):
            self.error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return b""
        if obj.get("usage"):
            self.response["usage"] = usage(obj["usage"])
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                out.append(self._text(text))
            for call in delta.get("tool_calls") or ():
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _text(self, text: str) -> bytes:
        out = b""
        if self.text_item is None:
            self.text_item = message_item("", status="in_progress")
            out += self._add(self.text_item)
            out += self.event("response.content_part.added", item_id=self.text_item["id"],
                              output_index=self._index(self.text_item), content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        self.text_item["content"][0]["text"] += text
        return out + self.event("response.output_text.delta", item_id=self.text_item["id"],
                                output_index=self._index(self.text_item), content_index=0, delta=text, logprobs=[])

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            item = call_item(call.get("id") or item_id("call"), function.get("name") or "", "", status="in_progress")
            self.calls[index] = item
            out += self._add(item)
        pieces = function.get("arguments") or ""
        if pieces:
            item["arguments"] += pieces
            out += self.event("response.function_call_arguments.delta", item_id=item["id"],
                              output_index=self._index(item), delta=pieces)
        return out

    def _close_items(self) -> bytes:
        out = []
        for index, item in enumerate(self.response["output"]):
            if item["status"] != "in_progress":
                continue
            item["status"] = "completed" if self.error is None else "incomplete"
            if item["type"] == "message":
                part = item["content"][0]
                out.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=part["text"], logprobs=[]))
                out.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                      content_index=0, part=part))
            else:
                out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, name=item["name"], arguments=item["arguments"]))
            out.append(self.event("response.output_item.done", output_index=index, item=item))
        return b"".join(out)

    def end(self, *, broken: bool = False) -> bytes:
        """The closing events: completed, incomplete, or (an in-band error, a broken stream) failed."""
        if broken and self.error is None:
            self.error = {"message": "The upstream worker failed mid-stream.", "code": "upstream_error"}
        out = self._close_items()
        if self.error is not None:
            self.response["status"] = "failed"
            self.response["error"] = {"code": self.error.get("code") or "server_error",
                                      "message": self.error.get("message") or "The response failed."}
            out += self.event("error", code=self.response["error"]["code"],
                              message=self.response["error"]["message"], param=self.error.get("param"))
            return out + self.event("response.failed", response=self.response)
        finish(self.response, self.finish_reason)
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        return out + self.event(kind, response=self.response)
