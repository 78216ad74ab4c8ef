"""The `Server-Timing` header of an answered /v1 request: where its time went before the first byte.

The gateway's stages, in milliseconds: auth, checks, limits, upstream (the connection and the worker's
headers, retries included: a streaming worker sends its headers with the first token) and journal (what
was left to wait, after them, for the usage journal's row: it is written while the worker starts). The worker's own stages follow, named `worker-<stage>`
(dataplane/worker/openai_request.py: accept, queue, prefill, send), a breakdown of `upstream`. Durations
only: nothing of other requests or tenants. benchmarks.flood reads it to say where a slow request
waited.
"""

from __future__ import annotations

import math
import re
import time

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def parse(header: str | None) -> dict[str, float]:
    """`auth;dur=0.4, limits;dur=3.1` as {"auth": 0.4, "limits": 3.1}; what does not parse is dropped."""
    stages: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, params = part.strip().partition(";")
        if not _NAME.fullmatch(name):
            continue
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                try:
                    ms = float(value)
                except ValueError:
                    break
                if math.isfinite(ms) and ms >= 0:
                    stages[name] = ms
                break
    return stages


class ServerTiming:
    __slots__ = ("last", "stages")

    def __init__(self, started: float) -> None:
        self.last = started
        self.stages: list[tuple[str, float]] = []

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((stage, (now - self.last) * 1000))
        self.last = now

    def header(self, worker: str | None = None) -> str:
        """The gateway's stages, then the worker's (its `Server-Timing`, re-written, not passed on)."""
        stages = self.stages + [(f"worker-{name}", ms) for name, ms in parse(worker).items()]
        return ", ".join(f"{name};dur={ms:.1f}" for name, ms in stages)
