"""A worker's load curve as the control plane reads it, and the step time it implies.

The worker measures it (dataplane/engine/load_curve.py, wire format version 1) and reports it with
a replica's "ready"; this side never imports the data plane (no torch in the control plane), so it
parses the dict itself and refuses anything malformed with ValueError.

The step model, from the measured points:
  decode(b): the measured decode step of b requests, linear between measured batch sizes and
      along the last segment's slope beyond the largest;
  prefill(n): the measured step that prefills n prompt tokens, linear between the measured sizes
      (from the origin below the smallest) and along the last segment's slope beyond the largest;
  context: what the long-context point adds per request per extra context token (attention).
A step with b decoding requests at mean context c and n prompt tokens takes
  max(decode(b), prefill(n + b)) + context_slope * b * max(c - context_tokens, 0):
the step runs all its tokens through the same matmuls, so a decode token in a prefill's step costs
what one more prompt token costs, and the step's fixed cost is paid once, not once per kind (a first
version added decode(b) to prefill's per-token slope and predicted ITLs 1.5-1.9x too high against
real workers: benchmarks/results/history/capacity.md).
"""

from __future__ import annotations

from dataclasses import dataclass

VERSION = 1
MAX_POINTS = 64


@dataclass(frozen=True, slots=True)
class LoadCurve:
    decode: tuple[tuple[int, float], ...]  # (batch, seconds), batch ascending
    prefill: tuple[tuple[int, float], ...]  # (tokens, seconds), tokens ascending
    context_tokens: int
    context_slope: float  # seconds per request per context token beyond context_tokens
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    threads: int | None = None
    device: str = ""
    long_context: dict | None = None  # as measured: {"batch", "tokens", "seconds"}

    @classmethod
    def from_dict(cls, data: object) -> LoadCurve:
        if not isinstance(data, dict):
            raise ValueError("load curve: not an object")
        if data.get("version") != VERSION:
            raise ValueError(f"load curve: version {data.get('version')!r} is not {VERSION}")
        decode = _points(data.get("decode"), "decode")
        prefill = _points(data.get("prefill"), "prefill")
        context = _positive_int(data.get("context_tokens"), "context_tokens")
        context_slope = 0.0
        long = data.get("long_context")
        kept_long = None
        if long is not None:
            if not isinstance(long, dict):
                raise ValueError("load curve: long_context is not an object")
            batch = _positive_int(long.get("batch"), "long_context.batch")
            tokens = _positive_int(long.get("tokens"), "long_context.tokens")
            seconds = _seconds(long.get("seconds"), "long_context.seconds")
            kept_long = {"batch": batch, "tokens": tokens, "seconds": seconds}
            if tokens > context:
                short = _interpolate(decode, batch)
                context_slope = max(seconds - short, 0.0) / (batch * (tokens - context))
        return cls(decode=decode, prefill=prefill, context_tokens=context, context_slope=context_slope,
                   max_num_seqs=_positive_int(data.get("max_num_seqs"), "max_num_seqs"),
                   max_num_batched_tokens=_positive_int(data.get("max_num_batched_tokens"), "max_num_batched_tokens"),
                   kv_cache_tokens=_positive_int(data.get("kv_cache_tokens"), "kv_cache_tokens"),
                   threads=data.get("threads") if isinstance(data.get("threads"), int) else None,
                   device=str(data.get("device") or "").replace("\x00", "")[:32], long_context=kept_long)

    def to_dict(self) -> dict:
        """The wire format again, with only what was parsed: what the control plane stores (a worker's
        extra keys, or a NUL that PostgreSQL's jsonb refuses, never reach the database)."""
        return {"version": VERSION, "decode": [list(p) for p in self.decode], "context_tokens": self.context_tokens,
                "long_context": self.long_context, "prefill": [list(p) for p in self.prefill],
                "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "kv_cache_tokens": self.kv_cache_tokens, "threads": self.threads, "device": self.device}

    def step_seconds(self, decoding: int, prefill_tokens: int, mean_context: float = 0.0) -> float:
        """Predicted wall time of a step of `decoding` requests (one token each) and `prefill_tokens`."""
        extra = max(mean_context - self.context_tokens, 0.0) * max(decoding, 0) * self.context_slope
        if prefill_tokens <= 0:
            return _interpolate(self.decode, max(decoding, 1)) + extra
        prefill = _interpolate(self.prefill, prefill_tokens + max(decoding, 0), from_origin=True)
        if decoding <= 0:
            return prefill
        return max(_interpolate(self.decode, decoding), prefill) + extra


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"load curve: {name} must be a positive integer")
    return value


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 3600:
        raise ValueError(f"load curve: {name} must be seconds in (0, 3600)")
    return float(value)


def _points(value: object, name: str) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_POINTS:
        raise ValueError(f"load curve: {name} must be a list of 1 to {MAX_POINTS} [size, seconds] pairs")
    points = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ValueError(f"load curve: {name} must be a list of [size, seconds] pairs")
        points.append((_positive_int(item[0], f"{name} size"), _seconds(item[1], f"{name} seconds")))
    points.sort()
    if len({size for size, _ in points}) != len(points):
        raise ValueError(f"load curve: {name} names a size twice")
    return tuple(points)


def _interpolate(points: tuple[tuple[int, float], ...], x: float, *, from_origin: bool = False) -> float:
    """Linear between the points; below the first: flat, or on the line from the origin
    (`from_origin`: a prompt of half the smallest size costs about half); beyond the last: its slope."""
    if len(points) == 1:
        size, seconds = points[0]
        return seconds * x / size if x > size or from_origin else seconds
    if x <= points[0][0]:
        return points[0][1] * x / points[0][0] if from_origin else points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + max((y1 - y0) / (x1 - x0), 0.0) * (x - x1)
