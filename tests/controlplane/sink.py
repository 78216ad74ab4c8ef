"""A usage sink for gateway tests: collects events, and counts deliveries per request id."""

from __future__ import annotations

import threading
from collections import Counter

EVENTS: list = []
DELIVERIES: Counter = Counter()
_lock = threading.Lock()


def collect(*, event) -> None:
    with _lock:
        DELIVERIES[event.request_id] += 1
        if DELIVERIES[event.request_id] == 1:
            EVENTS.append(event)


def clear() -> None:
    with _lock:
        EVENTS.clear()
        DELIVERIES.clear()


async def discard(*, event) -> None:
    """For profiling the gateway without the ledger write."""
