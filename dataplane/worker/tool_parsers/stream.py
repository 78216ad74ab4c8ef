"""A streamed answer cut into content and calls as its text arrives.

Text that cannot be part of a call goes out as content at once; text that may open a call (a
prefix of the opening tag, or a whole-answer parser's start) is held back. A call is sent once it
is complete (its closing tag, or the end of a whole answer) and parses: a botched call is then
still content, as in the non-streamed answer, never half a call the client cannot use.
"""

from __future__ import annotations

from typing import Any

from dataplane.worker.tool_parsers.base import ToolParser, ToolSpec

Event = tuple[str, Any]  # ("content", str) or ("call", OpenAI tool call dict)


class ToolStream:
    def __init__(self, parser: ToolParser, tools: dict[str, ToolSpec], parallel: bool = True) -> None:
        self.parser, self.tools, self.parallel = parser, tools, parallel
        self.buf = ""  # text held back
        self.held_space = ""  # tagged: whitespace after content, sent only if more content follows
        self.in_call = False  # tagged: inside an opening tag
        self.decided: bool | None = None  # whole: None until it is known whether the answer is calls
        self.num_calls = 0

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        return self._whole() if self.parser.whole else self._tagged()

    def finish(self) -> list[Event]:
        """The end of the answer: whatever was held back, as calls if it parses, else as content."""
        text, self.buf = self.buf, ""
        if self.parser.whole:
            if self.decided:
                parsed = self.parser.parse(text, self.tools, self.parallel)
                if parsed.calls:
                    self.num_calls += len(parsed.calls)
                    return [("call", c) for c in parsed.calls]
            return [("content", text)] if text else []
        out = self._content(text)
        if self.held_space and not self.num_calls:
            out.append(("content", self.held_space))
        self.held_space = ""
        return out

    def _whole(self) -> list[Event]:
        if self.decided is None:
            head = self.buf.lstrip()
            markers = [self.parser.start, *self.parser.prefixes]
            if not head or any(m.startswith(head) for m in markers):
                return []  # nothing yet, or could still be the start of calls
            self.decided = any(head.startswith(m) for m in markers)
        if self.decided:
            return []
        text, self.buf = self.buf, ""
        return [("content", text)]

    def _tagged(self) -> list[Event]:
        opens, closes = self.parser.opens, self.parser.closes
        out: list[Event] = []
        while True:
            if not self.in_call:
                i = self.buf.find(opens)
                if i < 0:
                    keep = _partial_suffix(self.buf, opens)
                    out += self._content(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return out
                out += self._content(self.buf[:i])
                self.buf, self.in_call = self.buf[i:], True
            j = self.buf.find(closes, len(opens))
            if j < 0:
                return out
            whole, self.buf, self.in_call = self.buf[:j + len(closes)], self.buf[j + len(closes):], False
            calls = self.parser.parse_calls(whole[len(opens):j], self.tools)
            if calls is None or (not self.parallel and self.num_calls):
                out += self._content(whole)
            else:
                self.held_space = ""  # whitespace between calls is not content
                self.num_calls += len(calls)
                out += [("call", c) for c in calls]

    def _content(self, text: str) -> list[Event]:
        if not text:
            return []
        text, self.held_space = self.held_space + text, ""
        body = text.rstrip()
        self.held_space = text[len(body):]
        return [("content", body)] if body else []


def _partial_suffix(text: str, tag: str) -> int:
    """How many trailing characters of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
