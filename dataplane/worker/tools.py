"""Tool calls (OpenAI's `tools` / `tool_choice`) through structured outputs.

As in vLLM without a tool-call parser: a named function (`tool_choice: {"type": "function",
"function": {"name": ...}}`) constrains the answer to that function's `parameters` schema and
returns it as the call's `arguments`; `required` constrains it to a JSON array of
`{"name", "parameters"}` objects, one of the tools each (one item when `parallel_tool_calls` is
false), returned as `tool_calls`. `auto` (the default with tools) lets the model choose between
text and calls in its own syntax, read back by the model's tool-call parser (tool_parsers/); by
default the call, once opened, is held to a valid call of a given tool (tool_parsers/grammar.py).
`none` (or no tools) answers in text; the tools still reach the chat template, as in vLLM.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from dataplane.structured.params import StructuredOutputs
from dataplane.worker.errors import invalid
from dataplane.worker.tool_parsers import ToolParser, ToolSpec, call

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


Tool = ToolSpec


@dataclass(frozen=True, slots=True)
class ToolMode:
    kind: str  # "named", "required" or "auto"
    tools: tuple[Tool, ...]  # the one named, or every tool
    parallel: bool = True
    parser: ToolParser | None = None  # auto: reads the model's calls out of its text
    constrained: bool = True  # auto: a call, once opened, is held to the tools' schemas

    @property
    def by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    def structured(self) -> StructuredOutputs | None:
        if self.kind == "auto":
            assert self.parser is not None
            if not self.constrained or not self.parser.constrainable:
                return None
            try:
                grammar = self.parser.constraint(list(self.tools), self.parallel)
            except ValueError as exc:
                raise invalid(str(exc), str(exc).split(":", 1)[0]) from None
            return StructuredOutputs(grammar=grammar, source="tools") if grammar else None
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


def parse_tools(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
                parser: ToolParser | None = None, constrained: bool = True) -> ToolMode | None:
    """What `tools` and `tool_choice` ask for; None when the answer is plain text. 400s name the field.
    `parser`: this model's tool-call parser (None: the worker has none, so `auto` is refused)."""
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
        if parser is None:
            raise invalid("tool_choice: 'auto' (the default with tools) needs a tool-call parser for this model, and "
                          "this worker has none (its tool_call_parser setting is 'none' or the model's template "
                          "names no known syntax); use tool_choice 'required' or name a function "
                          "({\"type\": \"function\", \"function\": {\"name\": ...}})", "tool_choice",
                          "unsupported_parameter")
        return ToolMode("auto", tuple(parsed), parallel_tool_calls is not False, parser, constrained)
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
