"""Hermes / ChatML tool calls (Qwen, Hermes, and SmolLM2 with the shipped template):
`<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`, any number, with text around them."""

from __future__ import annotations

import json
import re
from typing import Any

from dataplane.worker.tool_parsers.base import ToolParser, ToolSpec, call
from dataplane.worker.tool_parsers.grammar import json_call_grammar


class HermesParser(ToolParser):
    name = "hermes"
    opens = "<tool_call>"
    closes = "</tool_call>"
    constrainable = True
    arguments_head = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*(?=\S)')

    def parse_calls(self, text: str, tools: dict[str, ToolSpec]) -> list[dict[str, Any]] | None:
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        one = json_object_call(obj, tools, ("arguments",))
        return None if one is None else [one]

    def constraint(self, tools: list[ToolSpec], parallel: bool) -> str | None:
        return json_call_grammar(tools, parallel, trigger=self.opens,
                                 begin='<tool_call>\n{{"name": {name}, "arguments": ', end="}\n</tool_call>")


def json_object_call(obj: Any, tools: dict[str, ToolSpec], keys: tuple[str, ...]) -> dict[str, Any] | None:
    """`{"name": ..., <key>: {...}}` as an OpenAI call of one of `tools`; None if it is not one."""
    if not isinstance(obj, dict) or obj.get("name") not in tools:
        return None
    key = next((k for k in keys if k in obj), None)
    args: Any = {} if key is None else obj[key]
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict) or set(obj) - {"name", *keys}:
        return None
    return call(obj["name"], json.dumps(args, ensure_ascii=False))
