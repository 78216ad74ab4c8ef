"""Pythonic tool calls (Llama 3.2 / 4 and others): the answer is a Python list of calls,
`[get_weather(city="Paris"), get_time()]`, keyword arguments whose values are Python literals.
Parsed with `ast` (never evaluated); there is no constraint grammar for this syntax."""

from __future__ import annotations

import ast
import json
from typing import Any

from dataplane.worker.tool_parsers.base import ToolParser, ToolSpec, call

_WRAPPERS = (("<|python_start|>", "<|python_end|>"),)


class PythonicParser(ToolParser):
    name = "pythonic"
    whole = True
    start = "["
    prefixes = ("<|python_start|>",)

    def parse(self, text: str, tools: dict[str, ToolSpec], parallel: bool = True):  # type: ignore[override]
        stripped = text.strip()
        for head, tail in _WRAPPERS:
            if stripped.startswith(head) and stripped.endswith(tail):
                parsed = super().parse(stripped[len(head):-len(tail)], tools, parallel)
                return parsed if parsed.calls else type(parsed)(text)
        return super().parse(text, tools, parallel)

    def parse_calls(self, text: str, tools: dict[str, ToolSpec]) -> list[dict[str, Any]] | None:
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if not isinstance(tree.body, ast.List) or not tree.body.elts:
            return None
        calls = []
        for node in tree.body.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in tools
                    and not node.args and all(k.arg is not None for k in node.keywords)):
                return None
            try:
                args = {k.arg: _literal(k.value) for k in node.keywords}
            except ValueError:
                return None
            calls.append(call(node.func.id, json.dumps(args, ensure_ascii=False)))
        return calls


def _literal(node: ast.AST) -> Any:
    """A Python literal as JSON would hold it (tuples as lists); ValueError for anything else."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise ValueError("not a literal") from None
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise ValueError("not JSON-representable") from None
