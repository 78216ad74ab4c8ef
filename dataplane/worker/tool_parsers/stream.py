"""A streamed answer cut into content and calls as its text arrives.

Text that cannot be part of a call goes out as content at once; text that may open a call (a
prefix of the opening tag, or a whole-answer parser's start) is held back. A call is sent once it
is complete (its closing tag, or the end of a whole answer) and parses: a botched call is then
still content, as in the non-streamed answer, never half a call the client cannot use.

Incremental (`incremental=True`, for a parser with `arguments_head`, only while a grammar holds each
opened call to a tool's schema, so a call that starts is a call): as OpenAI streams one, the call's
id and name go out as soon as its head is read, then its arguments' text piece by piece as the
model writes it. Only what may be the call's own closing (`}`, whitespace, a prefix of the closing
tag) is held back; the pieces join to exactly the arguments' JSON text.
"""

from __future__ import annotations

from typing import Any

from dataplane.worker.tool_parsers.base import ToolParser, ToolSpec, call

# ("content", str), ("call", an OpenAI tool call dict), and when incremental ("call_open", a call dict
# with arguments "") then ("arguments", str) pieces
Event = tuple[str, Any]


class ToolStream:
    def __init__(self, parser: ToolParser, tools: dict[str, ToolSpec], parallel: bool = True,
                 incremental: bool = False) -> None:
        self.parser, self.tools, self.parallel = parser, tools, parallel
        self.incremental = incremental and parser.arguments_head is not None and not parser.whole
        self.args_at: int | None = None  # incremental: where the open call's arguments start in buf
        self.args_sent = 0  # ... and how many of their characters went out
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
        if self.args_at is not None:  # cut inside a call that went out incrementally (max_tokens): as OpenAI,
            out = self._arguments(len(self.buf.rstrip()))  # its arguments end where the model stopped
            self.buf, self.in_call, self.args_at, self.held_space = "", False, None, ""
            self.num_calls += 1
            return out
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
            if self.incremental and (self.parallel or not self.num_calls):
                out += self._open_call()
            j = self.buf.find(closes, len(opens))
            if j < 0:
                if self.args_at is not None:
                    out += self._arguments(self._safe_end())
                return out
            if self.args_at is not None:  # this call went out incrementally: send the rest of its arguments
                end = self.buf.rfind("}", self.args_at, j)
                out += self._arguments(max(end, self.args_at))
                self.buf, self.in_call, self.args_at = self.buf[j + len(closes):], False, None
                self.held_space = ""
                self.num_calls += 1
                continue
            whole, self.buf, self.in_call = self.buf[:j + len(closes)], self.buf[j + len(closes):], False
            calls = self.parser.parse_calls(whole[len(opens):j], self.tools)
            if calls is None or (not self.parallel and self.num_calls):
                out += self._content(whole)
            else:
                self.held_space = ""  # whitespace between calls is not content
                self.num_calls += len(calls)
                out += [("call", c) for c in calls]

    def _open_call(self) -> list[Event]:
        """The call's id and name once its head (`{"name": "...", "arguments": `) is in."""
        if self.args_at is not None:
            return []
        head = self.parser.arguments_head.match(self.buf, len(self.parser.opens))
        if head is None or head.group(1) not in self.tools:
            return []  # not yet (or not a call of a tool: it goes out whole, or as content, at its close)
        self.args_at, self.args_sent = head.end(), 0
        return [("call_open", call(head.group(1), ""))]

    def _safe_end(self) -> int:
        """Where the arguments' text that may go out now ends: before a `}` followed by nothing but
        whitespace and the start of the closing tag (it may close the call, not the arguments)."""
        end = self.buf.rfind("}", self.args_at)
        if end >= 0 and _could_close(self.buf[end + 1:], self.parser.closes):
            return end
        return len(self.buf.rstrip()) if self.buf[self.args_at:].strip() else self.args_at

    def _arguments(self, end: int) -> list[Event]:
        piece = self.buf[self.args_at + self.args_sent:end]
        self.args_sent += len(piece)
        return [("arguments", piece)] if piece else []

    def _content(self, text: str) -> list[Event]:
        if not text:
            return []
        text, self.held_space = self.held_space + text, ""
        body = text.rstrip()
        self.held_space = text[len(body):]
        return [("content", body)] if body else []


def _could_close(rest: str, closes: str) -> bool:
    stripped = rest.lstrip()
    return closes.startswith(stripped) if stripped else True


def _partial_suffix(text: str, tag: str) -> int:
    """How many trailing characters of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
