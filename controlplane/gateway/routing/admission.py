"""Load shedding at the gateway: refuse the lowest tiers first, fast, when workers queue up.

Each tier's priority (lower runs first) maps to a queue depth at which its requests are refused
with 429 `overloaded` + Retry-After before any reservation is made: `TESSERA_SHED_QUEUE_DEPTH`,
"priority=depth" pairs, a priority taking the entry with the largest key ≤ it ("20=16,30=4":
priorities 20–29 shed at 16 waiting, 30 and up at 4, below 20 never at the gateway — the worker's
own limits still apply). The queue is a worker's waiting queue as estimated from two figures:
the waiting count it reported at its last poll (`/ready`, every TESSERA_WORKER_POLL_SECONDS) and
this gateway's own in-flight requests beyond the worker's seats (max_num_seqs), which is current
to the request. A request is shed only when every candidate worker is past its tier's depth.
"""

from __future__ import annotations

from django.conf import settings

from common.errors import ApplicationError
from controlplane.gateway.routing.workers import Registry, Worker


def parse_depths(raw: str) -> list[tuple[int, int]]:
    """'20=16,30=4' -> [(20, 16), (30, 4)], sorted by priority; ValueError naming the bad pair."""
    table = []
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        priority, sep, depth = pair.partition("=")
        try:
            if not sep:
                raise ValueError
            table.append((int(priority), int(depth)))
        except ValueError:
            raise ValueError(f"TESSERA_SHED_QUEUE_DEPTH: expected priority=depth pairs, got {pair!r}") from None
    return sorted(table)


def depth_for(priority: int, table: list[tuple[int, int]]) -> int | None:
    """The shedding depth of a priority, None = never shed at the gateway."""
    depth = None
    for key, value in table:
        if priority >= key:
            depth = value
    return depth


def queue_estimate(worker: Worker) -> int:
    seats, waiting = getattr(worker, "seats", 0), getattr(worker, "waiting", 0)
    beyond_seats = getattr(worker, "outstanding", 0) - seats if seats else 0
    return max(waiting, beyond_seats, 0)


_parsed: tuple[str, list[tuple[int, int]]] | None = None


def _table() -> list[tuple[int, int]]:
    global _parsed
    raw = settings.TESSERA_SHED_QUEUE_DEPTH
    if _parsed is None or _parsed[0] != raw:
        _parsed = (raw, parse_depths(raw))
    return _parsed[1]


def check(registry: Registry, model: str, priority: int) -> None:
    """Raise 429 `overloaded` when every worker serving `model` is queued past this priority's depth."""
    depth = depth_for(priority, _table())
    if depth is None:
        return
    candidates = getattr(registry, "candidates", None)  # a registry without load figures never sheds
    workers = candidates(model) if candidates is not None else []
    if not workers or min(queue_estimate(w) for w in workers) < depth:
        return  # no worker: open_upstream answers 503 as before
    retry = max(1, int(settings.TESSERA_WORKER_POLL_SECONDS))
    raise ApplicationError(
        "The platform is overloaded and is shedding this tier's requests first. Please retry shortly.",
        code="overloaded", status=429, type="requests", headers={"Retry-After": str(retry)},
    )
