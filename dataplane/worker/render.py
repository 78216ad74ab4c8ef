"""Engine outputs as OpenAI response bodies and SSE chunks, chat and completions alike.

Chunks are plain dicts serialized with orjson (no pydantic on the per-token path). Logprobs
come in both of OpenAI's shapes: chat's `content[{token, logprob, bytes, top_logprobs}]` and
completions' parallel lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from dataplane.models.tokenizer import Tokenizer
from dataplane.scheduler.output import TokenLogprobs
from dataplane.worker.tool_parsers.stream import ToolStream
from dataplane.worker.tools import ToolMode, call

DONE = b"data: [DONE]\n\n"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenText:
    """A token id's exact bytes and its text (invalid UTF-8 shown as \\xNN, as OpenAI does), cached."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.byte_level = type(tokenizer.backend.decoder).__name__ == "ByteLevel"
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._bytes(token_id)
            hit = self._cache[token_id] = (raw.decode("utf-8", errors="backslashreplace"), list(raw))
        return hit

    def _bytes(self, token_id: int) -> bytes:
        if self.byte_level:
            piece = self.tokenizer.id_to_token(token_id)
            table = _byte_decoder()
            if piece and all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode()


def chat_logprobs(entries: list[TokenLogprobs], text: TokenText) -> dict[str, Any]:
    content = []
    for e in entries:
        tok, raw = text(e.token_id)
        tops = []
        for tid, lp in e.top:
            t, b = text(tid)
            tops.append({"token": t, "logprob": lp, "bytes": b})
        content.append({"token": tok, "logprob": e.logprob, "bytes": raw, "top_logprobs": tops})
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprobs], text: TokenText, offset: int) -> dict[str, Any]:
    """Completions' shape; `offset` is where the first token starts in the returned text."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        tok = text(e.token_id)[0]
        tokens.append(tok)
        lps.append(e.logprob)
        top = {tok: e.logprob}
        for tid, lp in e.top:
            top.setdefault(text(tid)[0], lp)
        tops.append(top)
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclass(slots=True)
class Choice:
    """One completion's progress, as the client sees it."""

    index: int
    text: list[str] = field(default_factory=list)  # non-streaming: the pieces, joined at the end
    num_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    offset: int = 0  # completions logprobs: characters before the next token
    finish_reason: str | None = None
    error: str | None = None
    num_calls: int = 0  # tool_choice auto, streamed: calls sent so far (each call's index)
    sent_role: bool = False  # chat streaming: the first chunk carries the role
    tool_stream: ToolStream | None = None  # tool_choice auto, streamed: content and calls as they come


class Renderer:
    """Builds one request's bodies; `chat` picks the endpoint's shapes."""

    def __init__(self, *, chat: bool, response_id: str, created: int, model: str, include_usage: bool,
                 logprobs: bool, text: TokenText, tools: ToolMode | None = None) -> None:
        self.chat = chat
        self.tools = tools if chat else None  # the answer is tool calls (worker/tools.py)
        self.head = {"id": response_id, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": created, "model": model}
        if chat:
            self.head["system_fingerprint"] = None
        # Every chunk of the request starts alike: serialize that once; per token only the choice.
        self._prefix = b"data: " + orjson.dumps(self.head)[:-1] + b',"choices":['
        self._suffix = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.text = text

    def _logprobs(self, c: Choice, entries: list[TokenLogprobs] | None) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        entries = entries or []
        if self.chat:
            return chat_logprobs(entries, self.text)
        out = completion_logprobs(entries, self.text, c.offset)
        c.offset = out["text_offset"][-1] + len(out["tokens"][-1]) if entries else c.offset
        return out

    # -- streaming -----------------------------------------------------------------------------
    def chunks(self, c: Choice, text: str, entries: list[TokenLogprobs] | None, finish_reason: str | None
               ) -> list[dict[str, Any]]:
        """One choice's chunks for a delta: one, none, or (tool_choice auto) a call's several."""
        if self.tools is not None and self.tools.kind == "auto":
            return self._auto_chunks(c, text, entries, finish_reason)
        chunk = self.chunk(c, text, entries, finish_reason)
        return [] if chunk is None else [chunk]

    def _auto_chunks(self, c: Choice, text: str, entries: list[TokenLogprobs] | None, finish_reason: str | None
                     ) -> list[dict[str, Any]]:
        """Content as it comes; each call as OpenAI streams one: its id and name (arguments ""), then
        its arguments: in pieces as the model writes them while a grammar holds calls to the tools'
        schemas (tool_parsers/stream.py), else whole once the call is complete and parses."""
        tools = self.tools
        assert tools is not None and tools.parser is not None
        if c.tool_stream is None:
            c.tool_stream = ToolStream(tools.parser, tools.by_name, tools.parallel,
                                       incremental=tools.constrained and tools.parser.constrainable)
        stream = c.tool_stream
        events = stream.feed(text) if text else []
        if finish_reason is not None:
            events += stream.finish()
        deltas: list[dict[str, Any]] = []
        for kind, value in events:
            if kind == "content":
                if deltas and "content" in deltas[-1] and "tool_calls" not in deltas[-1]:
                    deltas[-1]["content"] += value
                else:
                    deltas.append({"content": value})
                continue
            if kind == "arguments":  # the open call's next piece (incremental)
                tail = deltas[-1]["tool_calls"][0]["function"] if deltas and "tool_calls" in deltas[-1] else None
                if tail is not None and "name" not in tail:
                    tail["arguments"] += value
                else:
                    deltas.append({"tool_calls": [{"index": c.num_calls - 1, "function": {"arguments": value}}]})
                continue
            k = c.num_calls
            c.num_calls += 1
            fn = value["function"]
            if kind == "call_open":
                deltas.append({"tool_calls": [{"index": k, "id": value["id"], "type": "function",
                                               "function": {"name": fn["name"], "arguments": ""}}]})
                continue
            deltas.append({"tool_calls": [{"index": k, "id": value["id"], "type": "function",
                                           "function": {"name": fn["name"], "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
        if not c.sent_role:
            c.sent_role = True
            if deltas and "content" in deltas[0]:
                deltas[0] = {"role": "assistant", **deltas[0]}
            else:
                deltas.insert(0, {"role": "assistant", "content": ""})
        if not deltas and (finish_reason is not None or (self.logprobs and entries)):
            deltas.append({})
        if finish_reason == "stop" and c.num_calls:
            finish_reason = "tool_calls"
        out = [{"index": c.index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
        if out:
            out[0]["logprobs"] = self._logprobs(c, entries)
            out[-1]["finish_reason"] = finish_reason
        return out

    def chunk(self, c: Choice, text: str, entries: list[TokenLogprobs] | None, finish_reason: str | None
              ) -> dict[str, Any] | None:
        """One choice's chunk for a delta, or None when it carries nothing the client can see."""
        if self.tools is not None:
            return self._tool_chunk(c, text, entries, finish_reason)
        if not text and not finish_reason and not (self.logprobs and entries) and (c.sent_role or not self.chat):
            return None
        if self.chat:
            delta: dict[str, Any] = {}
            if not c.sent_role:
                delta["role"] = "assistant"
                c.sent_role = True
            if text or "role" in delta:
                delta["content"] = text
            return {"index": c.index, "delta": delta, "logprobs": self._logprobs(c, entries),
                    "finish_reason": finish_reason}
        return {"index": c.index, "text": text, "logprobs": self._logprobs(c, entries),
                "finish_reason": finish_reason}

    def _tool_chunk(self, c: Choice, text: str, entries: list[TokenLogprobs] | None, finish_reason: str | None
                    ) -> dict[str, Any] | None:
        """A named call streams its arguments as they come (OpenAI's shape: the id and name first);
        `required` calls are sent whole when the answer ends (the array must be parsed first)."""
        tools = self.tools
        assert tools is not None
        delta: dict[str, Any] = {}
        if not c.sent_role:
            delta.update(role="assistant", content=None)
            c.sent_role = True
            if tools.kind == "named":
                delta["tool_calls"] = [{"index": 0, **call(tools.tools[0].name, "")}]
        if tools.kind == "named":
            if text and "tool_calls" in delta:
                delta["tool_calls"][0]["function"]["arguments"] = text
            elif text:
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": text}}]
        else:
            c.text.append(text)
            if finish_reason is not None:
                calls = tools.calls("".join(c.text))
                if calls is None:  # cut short: no complete call to report, so the raw answer
                    delta["content"] = "".join(c.text)
                else:
                    delta["tool_calls"] = [{"index": k, **x} for k, x in enumerate(calls)]
                    finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        if not delta and not finish_reason and not (self.logprobs and entries):
            return None
        return {"index": c.index, "delta": delta, "logprobs": self._logprobs(c, entries), "finish_reason": finish_reason}

    def _tool_message(self, c: Choice, text: str) -> tuple[dict[str, Any], str | None]:
        tools = self.tools
        assert tools is not None
        if tools.kind == "auto":
            assert tools.parser is not None
            parsed = tools.parser.parse(text, tools.by_name, tools.parallel)
            if not parsed.calls:
                return {"role": "assistant", "content": text, "refusal": None}, c.finish_reason
            reason = "tool_calls" if c.finish_reason == "stop" else c.finish_reason
            return {"role": "assistant", "content": parsed.content, "refusal": None, "tool_calls": parsed.calls}, reason
        calls = tools.calls(text)
        if calls is None:
            return {"role": "assistant", "content": text, "refusal": None}, c.finish_reason
        reason = "tool_calls" if tools.kind == "required" and c.finish_reason == "stop" else c.finish_reason
        return {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}, reason

    def event(self, choices: list[dict[str, Any]], frame: bytes = b"") -> bytes:
        """One SSE event per choice (OpenAI sends one choice per chunk), written in one send; `frame`
        (an accounting comment line, or nothing) opens each of them."""
        return b"".join(frame + self._prefix + orjson.dumps(ch) + self._suffix for ch in choices)

    def usage_event(self, u: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({**self.head, "choices": [], "usage": u}) + b"\n\n"

    # -- whole responses -----------------------------------------------------------------------
    def response(self, choices: list[Choice], u: dict[str, Any], echo: list[str] | None, n: int) -> bytes:
        out = []
        for c in choices:
            text = "".join(c.text)
            lp = self._logprobs(c, c.logprobs)
            if self.chat and self.tools is not None:
                message, reason = self._tool_message(c, text)
                out.append({"index": c.index, "message": message, "logprobs": lp, "finish_reason": reason})
            elif self.chat:
                out.append({"index": c.index, "message": {"role": "assistant", "content": text, "refusal": None},
                            "logprobs": lp, "finish_reason": c.finish_reason})
            else:
                if echo is not None:
                    text = echo[c.index // n] + text
                out.append({"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason})
        body = {**self.head, "object": "chat.completion" if self.chat else "text_completion", "choices": out,
                "usage": u}
        return orjson.dumps(body)
