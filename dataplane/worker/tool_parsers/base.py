"""What every tool-call parser shares: the parsed result, the streaming events, the parser contract.

A parser reads the model's own tool-call syntax out of its text (`parse`, for a whole answer), and
says how a stream is cut (`start`, `opens`, `closes`): either the whole answer is calls
(`whole=True`: Llama-3 JSON, pythonic) or calls sit between tags inside free text (Hermes). A
parser may also give the grammar that constrains a call once the model opens one (`constraint`).
Anything that does not parse as a call of a given tool comes back as content, never an error.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class Parsed:
    content: str | None  # text around the calls (None when there is none)
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's tool_calls


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


class ToolParser:
    """One model family's tool-call syntax. Subclasses set `name` and implement `parse_calls`."""

    name = ""
    whole = False  # the answer is either all calls or all text, decided by how it starts
    start = ""  # whole: the answer is calls when its stripped text starts with this
    opens = ""  # tagged: the text that opens a call
    closes = ""  # tagged: the text that closes it
    constrainable = False  # constraint() gives a grammar
    prefixes: tuple[str, ...] = ()  # whole: other openings that also mean calls
    # tagged: the call's head up to where its arguments' JSON starts, group 1 the name (incremental streaming)
    arguments_head: re.Pattern[str] | None = None

    def parse_calls(self, text: str, tools: dict[str, ToolSpec]) -> list[dict[str, Any]] | None:
        """`text` (a whole answer, or one tag's inside) as calls of `tools`; None if it is not."""
        raise NotImplementedError

    def parse(self, text: str, tools: dict[str, ToolSpec], parallel: bool = True) -> Parsed:
        """A whole answer: its calls and what is left as content. A botched call stays content."""
        if self.whole:
            calls = self.parse_calls(text, tools) if text.strip().startswith(self.start) else None
            if not calls or (not parallel and len(calls) > 1):
                return Parsed(text)
            return Parsed(None, calls)
        content, calls, rest = [], [], text
        while (i := rest.find(self.opens)) >= 0:
            j = rest.find(self.closes, i + len(self.opens))
            if j < 0:
                break
            inner = rest[i + len(self.opens):j]
            got = self.parse_calls(inner, tools)
            if got is None or (not parallel and calls):
                content.append(rest[:j + len(self.closes)])
            else:
                content.append(rest[:i])
                calls.extend(got)
            rest = rest[j + len(self.closes):]
        content.append(rest)
        joined = "".join(content)
        if not calls:
            return Parsed(joined)
        return Parsed(joined.rstrip() or None, calls)  # as streamed: whitespace before a call is not content

    def constraint(self, tools: list[ToolSpec], parallel: bool) -> str | None:
        """An EBNF grammar (xgrammar's dialect) that leaves text free and constrains each call."""
        return None
