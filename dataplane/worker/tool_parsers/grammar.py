"""The grammar that lets the model write text freely and, once it opens a call, holds the rest of
the call to one of the given tools with arguments valid under that tool's schema.

Built with xgrammar's structural tags (a `triggered_tags` format: free text until a trigger, then
one of the tags, each `begin content end`), rendered to EBNF so that it compiles through the
structured-outputs backend like any other grammar (under the same compile deadline and cache).
Arguments are compact JSON, as for every other schema here (backend.py says why).
"""

from __future__ import annotations

import json
from typing import Any

from dataplane.worker.tool_parsers.base import ToolSpec


def _xgr() -> Any:
    import xgrammar  # lazy: heavy, ~1.3 s after torch; only once a request forces a tool call

    return xgrammar


def json_call_grammar(tools: list[ToolSpec], parallel: bool, *, trigger: str, begin: str, end: str) -> str:
    """EBNF: free text; a call opens with `begin` (formatted with the tool's JSON-quoted name) after
    `trigger`, then the arguments object, then `end`. ValueError naming the tool for a bad schema."""
    xgr = _xgr()
    tags = []
    for i, t in enumerate(tools):
        try:
            args = str(xgr.Grammar.from_json_schema(json.dumps(t.parameters), any_whitespace=False))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"tools[{i}].function.parameters: invalid JSON schema: {str(exc).strip()[:200]}") from None
        tags.append({"type": "tag", "begin": begin.format(name=json.dumps(t.name)),
                     "content": {"type": "grammar", "grammar": args}, "end": end})
    spec = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [trigger], "tags": tags,
                                                 "at_least_one": False, "stop_after_first": not parallel}}
    return str(xgr.Grammar.from_structural_tag(json.dumps(spec)))
