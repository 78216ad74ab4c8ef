"""A Responses API request (POST /v1/responses) read and translated into a chat-completions body.

The gateway serves the Responses API by sending the worker a chat-completions request, so limits,
the usage journal, exact metering and budgets are the chat path's own (proxy.handle). Everything a
client may send is either translated here or refused with a 400 naming the field: a field that
would change the answer is never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from controlplane.gateway.parsing import MAX_TOKENS_LIMIT, content_parts, invalid, json_object, type_error

# Accepted only at the value that means "nothing special": anything else is refused, naming the field.
NEUTRAL = {
    "truncation": (None, "disabled"),
    "background": (None, False),
    "include": (None, []),
    "reasoning": (None,),
    "service_tier": (None, "auto", "default"),
    "stream_options": (None,),
    "top_logprobs": (None, 0),
    "max_tool_calls": (None,),
    "prompt": (None,),
    "conversation": (None,),
}
# The user / safety / cache-key hints change nothing the model produces.
IGNORED = ("user", "safety_identifier", "prompt_cache_key")
TRANSLATED = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
              "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "metadata")
ROLES = ("user", "system", "developer", "assistant")
METADATA_KEYS = 16
METADATA_VALUE_CHARS = 512


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    body: dict[str, Any]  # as the client sent it
    items: list[dict[str, Any]]  # this turn's input items, normalized
    stream: bool
    store: bool
    previous_response_id: str | None

    def chat_body(self, context: list[dict[str, Any]]) -> bytes:
        """The chat-completions request for this turn, after `context` (earlier turns' items)."""
        body = self.body
        messages = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": body["instructions"]})
        messages.extend(items_to_messages(context + self.items))
        chat: dict[str, Any] = {"model": body["model"], "messages": messages}
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        for name in ("temperature", "top_p", "parallel_tool_calls"):
            if body.get(name) is not None:
                chat[name] = body[name]
        if body.get("tools"):
            chat["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters",
                                                                               "strict") if t.get(k) is not None}}
                             for t in body["tools"]]
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif choice is not None:
            chat["tool_choice"] = choice
        fmt = (body.get("text") or {}).get("format")
        if fmt and fmt.get("type") == "json_schema":
            spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
            chat["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif fmt and fmt.get("type") == "json_object":
            chat["response_format"] = {"type": "json_object"}
        if self.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}  # the usage object of response.completed
        return orjson.dumps(chat)


def _unsupported(param: str, what: str = "is not supported by this platform"):
    return invalid(f"Unsupported parameter: '{param}' {what}.", param, "unsupported_parameter")


def _text_parts(content: Any, param: str, allowed: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for where, part in content_parts(content, param, "a string or an array of content parts"):
        kind = part.get("type")
        if kind not in allowed:
            raise _unsupported(f"{where}.type", f"{kind!r} is not supported (text parts only: {', '.join(allowed)})")
        if not isinstance(part.get("text"), str):
            raise type_error(f"{where}.text", "a string")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: dict, name: str, param: str) -> str:
    value = item.get(name)
    if value is None:
        raise invalid(f"Missing required parameter: '{param}.{name}'.", f"{param}.{name}", "missing_required_parameter")
    if not isinstance(value, str):
        raise type_error(f"{param}.{name}", "a string")
    return value


def _item(i: int, item: Any) -> dict[str, Any]:
    """One input item, normalized to what the store keeps and items_to_messages reads."""
    param = f"input[{i}]"
    if not isinstance(item, dict):
        raise type_error(param, "an input item object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise invalid(f"Invalid value for '{param}.role': expected one of {', '.join(ROLES)}.", f"{param}.role",
                          "invalid_value")
        allowed = ("output_text", "input_text") if role == "assistant" else ("input_text",)
        return {"type": "message", "role": role, "content": _text_parts(item.get("content"), f"{param}.content", allowed)}
    if kind == "function_call":
        return {"type": "function_call", "call_id": _string(item, "call_id", param), "name": _string(item, "name", param),
                "arguments": _string(item, "arguments", param)}
    if kind == "function_call_output":
        output = item.get("output")
        text = _text_parts(output, f"{param}.output", ("input_text",)) if output is not None else None
        if text is None:
            raise invalid(f"Missing required parameter: '{param}.output'.", f"{param}.output", "missing_required_parameter")
        return {"type": "function_call_output", "call_id": _string(item, "call_id", param), "output": text}
    raise _unsupported(f"{param}.type", f"{kind!r} is not supported (message, function_call, function_call_output)")


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized items as chat messages: consecutive function calls are one assistant turn's tool_calls
    (after its text, if the turn had any), and each call's output a `tool` message."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": item["content"]})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
                last.setdefault("tool_calls", []).append(call)
                if not last.get("content"):
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def _tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise type_error("tools", "an array of tool objects")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise type_error(f"tools[{i}]", "a tool object")
        if tool.get("type") != "function":
            raise _unsupported(f"tools[{i}].type", f"{tool.get('type')!r} is not supported (function tools only)")
        _string(tool, "name", f"tools[{i}]")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise type_error(f"tools[{i}].parameters", "a JSON schema object")


def _tool_choice(choice: Any) -> None:
    if choice is None or choice in ("none", "auto", "required"):
        return
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return
    raise _unsupported("tool_choice", "takes 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}")


def _text(text: Any) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise type_error("text", "an object")
    for key in text:
        if key != "format" and not (key == "verbosity" and text[key] in (None, "medium")):
            raise _unsupported(f"text.{key}")
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise type_error("text.format", "an object")
    kind = fmt.get("type")
    if kind == "json_schema":
        _string(fmt, "name", "text.format")
        if not isinstance(fmt.get("schema"), dict):
            raise invalid("Missing required parameter: 'text.format.schema' (a JSON schema object).",
                          "text.format.schema", "missing_required_parameter")
    elif kind not in ("text", "json_object"):
        raise _unsupported("text.format.type", f"{kind!r} is not supported (text, json_object, json_schema)")


def _number(body: dict, name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise type_error(name, "a number")
    if not low <= value <= high:
        raise invalid(f"Invalid value for '{name}': expected a number from {low} to {high}.", name, "invalid_value")


def _metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > METADATA_KEYS:
        raise type_error("metadata", f"an object of at most {METADATA_KEYS} string values")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(value) > METADATA_VALUE_CHARS or len(key) > 64:
            raise invalid(f"Invalid value for 'metadata.{key}': a string of at most {METADATA_VALUE_CHARS} characters "
                          "under a key of at most 64.", f"metadata.{key}", "invalid_value")


def parse(raw: bytes) -> ResponsesRequest:
    body = json_object(raw)
    for name, value in body.items():
        if name in TRANSLATED or name in IGNORED:
            continue
        if name not in NEUTRAL:
            raise _unsupported(name)
        if value not in NEUTRAL[name]:
            raise _unsupported(name, f"is supported only as {NEUTRAL[name][-1]!r}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise invalid("you must provide a model parameter", "model", "missing_required_parameter")
    given = body.get("input")
    if isinstance(given, str):
        items = [{"type": "message", "role": "user", "content": given}]
    elif isinstance(given, list):
        items = [_item(i, item) for i, item in enumerate(given)]
    elif given is None:
        raise invalid("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    else:
        raise type_error("input", "a string or an array of input items")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise type_error("instructions", "a string")
    tokens = body.get("max_output_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS_LIMIT):
        raise invalid(f"Invalid value for 'max_output_tokens': expected an integer from 1 to {MAX_TOKENS_LIMIT}.",
                      "max_output_tokens", "invalid_value")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    if body.get("tools") is not None:
        _tools(body["tools"])
    _tool_choice(body.get("tool_choice"))
    _text(body.get("text"))
    _metadata(body.get("metadata"))
    for name in ("stream", "store", "parallel_tool_calls"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise type_error(name, "a boolean")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise type_error("previous_response_id", "a string")
    if not items and not previous:
        raise invalid("'input' must contain at least one item.", "input", "invalid_value")
    return ResponsesRequest(body=body, items=items, stream=bool(body.get("stream")),
                            store=body.get("store") is not False, previous_response_id=previous)
