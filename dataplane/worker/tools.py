"""Tool calls (OpenAI's `tools` / `tool_choice`) through structured outputs.

As in vLLM without a tool-call parser: a named function (`tool_choice: {"type": "function",
"function": {"name": ...}}`) constrains the answer to that function's `parameters` schema and
returns it as the call's `arguments`; `required` constrains it to a JSON array of
`{"name", "parameters"}` objects, one of the tools each (one item when `parallel_tool_calls` is
false), returned as `tool_calls`. `auto` needs a parser for the model's own tool-call syntax,
which this worker does not have: it is a 400 naming what works instead, not a silent plain answer.
`none` (or no tools) answers in text; the tools still reach the chat template, as in vLLM.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from dataplane.structured.params import StructuredOutputs
from dataplane.worker.errors import invalid

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolMode:
    kind: str  # "named" or "required"
    tools: tuple[Tool, ...]  # the one named, or every tool
    parallel: bool = True

    def structured(self) -> StructuredOutputs:
        if self.kind == "named":
            return StructuredOutputs(json=self.tools[0].parameters, source="tools")
        item = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "parameters": t.parameters},
                           "required": ["name", "parameters"], "additionalProperties": False} for t in self.tools]}
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": item}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutputs(json=schema, source="tools")

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The answer as OpenAI's `tool_calls`, or None when it is not a complete call (cut at max_tokens)."""
        if self.kind == "named":
            return [call(self.tools[0].name, text)]
        try:
            items = json.loads(text)
        except ValueError:
            return None
        return [call(item["name"], json.dumps(item["parameters"], ensure_ascii=False)) for item in items]


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def parse_tools(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None) -> ToolMode | None:
    """What `tools` and `tool_choice` ask for; None when the answer is plain text. 400s name the field."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise invalid("tool_choice: only allowed when tools are given", "tool_choice")
        return None
    parsed = [_tool(i, t) for i, t in enumerate(tools)]
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise invalid("tools: function names must be unique", "tools")
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if choice == "auto":
        raise invalid("tool_choice: 'auto' needs a parser for this model's own tool-call syntax, which this worker "
                      "does not have; use tool_choice 'required' or name a function "
                      "({\"type\": \"function\", \"function\": {\"name\": ...}})", "tool_choice", "unsupported_parameter")
    if choice == "required":
        return ToolMode("required", tuple(parsed), parallel_tool_calls is not False)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise invalid(f"tool_choice: no tool named {name!r} among tools {names}", "tool_choice")
        return ToolMode("named", (parsed[names.index(name)],))
    raise invalid("tool_choice: must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                  "{\"name\": ...}}", "tool_choice")


def _tool(i: int, t: Any) -> Tool:
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
        raise invalid(f"tools[{i}]: must be {{\"type\": \"function\", \"function\": {{...}}}}", f"tools[{i}]")
    fn = t["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(f"tools[{i}].function.name: must be 1-64 letters, digits, underscores or dashes",
                      f"tools[{i}].function.name")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise invalid(f"tools[{i}].function.parameters: must be a JSON schema object",
                      f"tools[{i}].function.parameters")
    return Tool(name, params)


def template_message(msg: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's tool calls as chat templates take them: arguments as objects
    (Hugging Face's convention) where the client sent OpenAI's JSON strings."""
    calls = msg.get("tool_calls")
    if not calls:
        return msg
    out = []
    for c in calls:
        fn = dict(c.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except ValueError:
                pass  # left as the client sent it
        out.append({**c, "function": fn})
    return {**msg, "tool_calls": out}
