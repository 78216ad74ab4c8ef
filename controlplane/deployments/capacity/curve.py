"""A worker's load curve as the control plane reads it, and the step time it implies.

The worker measures it (dataplane/engine/load_curve.py, wire format version 1) and reports it with
a replica's "ready"; this side never imports the data plane (no torch in the control plane), so it
parses the dict itself and refuses anything malformed with ValueError.

The step model, from the measured points:
  decode(b): the measured decode step of b requests, linear between measured batch sizes and
      along the last segment's slope beyond the largest;
  prefill tokens: the slope of a least-squares line through the single-prefill points (what one
      more prompt token adds to a step; its intercept is the step's fixed cost, already in decode(b));
  context: what the long-context point adds per request per extra context token (attention).
A step with b decoding requests at mean context c and n prefill tokens takes
  decode(b) + prefill_slope * n + context_slope * b * max(c - context_tokens, 0),
and a step with prefill only takes prefill_intercept + prefill_slope * n.
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
    prefill_intercept: float
    prefill_slope: float  # seconds per prompt token
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
        intercept, slope = _line(prefill)
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
                   prefill_intercept=intercept, prefill_slope=slope,
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
        if decoding <= 0:
            return self.prefill_intercept + self.prefill_slope * prefill_tokens
        extra = max(mean_context - self.context_tokens, 0.0) * decoding * self.context_slope
        return _interpolate(self.decode, decoding) + self.prefill_slope * prefill_tokens + extra


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


def _line(points: tuple[tuple[int, float], ...]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line; one point: a line through the origin."""
    if len(points) == 1:
        size, seconds = points[0]
        return 0.0, seconds / size
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = max(sum((x - mx) * (y - my) for x, y in points) / var, 0.0)  # more tokens never cost less
    return max(my - slope * mx, 0.0), slope


def _interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    if len(points) == 1:
        size, seconds = points[0]
        return seconds * max(x, 1) / size if x > size else seconds
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + max((y1 - y0) / (x1 - x0), 0.0) * (x - x1)
