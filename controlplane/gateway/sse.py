"""Relaying an upstream SSE stream event by event, counting what was delivered.

Events are forwarded as soon as they are complete (no buffering beyond one event). Each `data:`
payload is parsed to pick up the final usage chunk (dropped again when the gateway asked for it on
the client's behalf), to count delivered deltas (for inter-token latency, not billing) and to
keep a little of the text when the request was sampled for content logs.

Billing counts come from the worker alone: the gateway asks for them (`X-Tessera-Accounting: 1`)
and the worker opens each event with an SSE comment line `: usage {"prompt_tokens": P,
"cached_tokens": C, "completion_tokens": G}`, its cumulative counts as of that event (G counts
tokens whose text a stop string still holds back). The line is stripped before the event is
forwarded; the last one seen is what was generated up to the last event the client was sent.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from controlplane.gateway.usage.worker_usage import WorkerCounts, counts_from

ACCOUNTING_LINE = b": usage "
_TERMINATORS = (b"\n\n", b"\r\n\r\n")


def _next_boundary(buffer: bytes) -> tuple[int, int]:
    """(index, length) of the first event terminator, or (-1, 0)."""
    best, size = -1, 0
    for term in _TERMINATORS:
        i = buffer.find(term)
        if i >= 0 and (best < 0 or i < best):
            best, size = i, len(term)
    return best, size


class StreamMeter:
    def __init__(self, *, kind: str, strip_usage: bool, keep_text: bool = False) -> None:
        self.kind = kind
        self.text: list[str] | None = [] if keep_text else None  # completion text, only when sampled for logs
        self.strip_usage = strip_usage
        self.buffer = b""
        self.delivered_tokens = 0  # non-empty deltas forwarded (latency figures; billing uses worker_counts)
        self.worker_counts: WorkerCounts | None = None  # the worker's cumulative counts at the last event
        self.usage: dict[str, Any] | None = None
        self.first_token_at: float | None = None  # perf_counter
        self.last_token_at: float | None = None  # perf_counter (mean ITL = span / (tokens - 1))
        self.done = False  # saw [DONE]
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Take raw upstream bytes; return the complete events to forward now."""
        self.buffer += chunk
        out: list[bytes] = []
        while True:
            i, size = _next_boundary(self.buffer)
            if i < 0:
                break
            event, self.buffer = self.buffer[: i + size], self.buffer[i + size :]
            if event.startswith(ACCOUNTING_LINE):
                event = self._take_accounting(event)
            if self._keep(event):
                out.append(event)
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self.buffer = self.buffer, b""
        if rest.startswith(ACCOUNTING_LINE):  # an unterminated last event: its counts are not the client's
            rest = self._take_accounting(rest)
        return rest

    def _take_accounting(self, event: bytes) -> bytes:
        """Read the worker's counts from the event's first line and return the event without it."""
        line, _, rest = event.partition(b"\n")
        try:
            self.worker_counts = counts_from(orjson.loads(line[len(ACCOUNTING_LINE):]))
        except (orjson.JSONDecodeError, ValueError, AttributeError):
            pass  # a malformed frame: the usage query after the request settles it
        return rest

    def _keep(self, event: bytes) -> bool:
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return True
            if not isinstance(obj, dict):
                return True
            if obj.get("error"):
                self.error = obj["error"]
            if obj.get("usage"):
                self.usage = obj["usage"] if isinstance(obj["usage"], dict) else None
                if self.strip_usage and not obj.get("choices"):
                    return False
            self._count(obj.get("choices") or ())
        return True

    def _count(self, choices) -> None:
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if self.kind == "chat":
                delta = choice.get("delta") or {}
                produced = delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")
            else:
                produced = choice.get("text")
            if produced:
                self.delivered_tokens += 1
                self.last_token_at = time.perf_counter()
                if self.first_token_at is None:
                    self.first_token_at = self.last_token_at
                if self.text is not None and isinstance(produced, str):
                    self.text.append(produced)

    def mean_itl_ms(self) -> float | None:
        """Mean gap between delivered tokens (all choices together), None with fewer than two."""
        if self.delivered_tokens < 2 or self.first_token_at is None or self.last_token_at is None:
            return None
        return (self.last_token_at - self.first_token_at) * 1000 / (self.delivered_tokens - 1)


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """(prompt, cached, completion) from an OpenAI usage object."""
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return (
        int(usage.get("prompt_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )
