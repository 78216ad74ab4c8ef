"""Llama 3.1+ JSON tool calls: the answer is `{"name": "...", "parameters": {...}}` (Meta's
templates; `arguments` is taken too), optionally after `<|python_tag|>`, several joined by `;`."""

from __future__ import annotations

import json
from typing import Any

from dataplane.worker.tool_parsers.base import ToolParser, ToolSpec
from dataplane.worker.tool_parsers.grammar import json_call_grammar
from dataplane.worker.tool_parsers.hermes import json_object_call

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    whole = True
    start = "{"
    prefixes = (PYTHON_TAG,)  # also the start of calls
    constrainable = True

    def parse(self, text: str, tools: dict[str, ToolSpec], parallel: bool = True):  # type: ignore[override]
        stripped = text.lstrip()
        if stripped.startswith(PYTHON_TAG):
            parsed = super().parse(stripped[len(PYTHON_TAG):], tools, parallel)
            return parsed if parsed.calls else type(parsed)(text)
        return super().parse(text, tools, parallel)

    def parse_calls(self, text: str, tools: dict[str, ToolSpec]) -> list[dict[str, Any]] | None:
        decoder, calls, i, text = json.JSONDecoder(), [], 0, text.strip()
        while i < len(text):
            try:
                obj, i = decoder.raw_decode(text, i)
            except ValueError:
                return None
            one = json_object_call(obj, tools, ("parameters", "arguments"))
            if one is None:
                return None
            calls.append(one)
            while i < len(text) and text[i] in " \t\r\n;":
                i += 1
        return calls or None

    def constraint(self, tools: list[ToolSpec], parallel: bool) -> str | None:
        return json_call_grammar(tools, parallel, trigger='{"name": ',
                                 begin='{{"name": {name}, "parameters": ', end="}")
