"""One call in flight per key: the callers that ask while it runs share its result.

Why: a burst of requests that all miss the same cache (a new client's first second, or every time a
cached entry expires under load) each ran the same database query side by side, and filled the
gateway's database threads that every other tenant's request then waited for. One query serves them
all. Each event loop has its own calls (a future belongs to the loop that made it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._running: dict[tuple[int, Hashable], asyncio.Future[T]] = {}

    async def run(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s result, from the call already in flight for `key` on this loop if there is one.
        A caller that leaves (cancelled) does not cancel the call for the others."""
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        running = self._running.get(slot)
        if running is None or running.get_loop() is not loop:  # a closed loop's id may be reused
            running = self._running[slot] = asyncio.ensure_future(call())
            running.add_done_callback(lambda done: self._finished(slot, done))
        return await asyncio.shield(running)

    def in_flight(self) -> int:
        return len(self._running)

    def _finished(self, slot: tuple[int, Hashable], done: asyncio.Future[T]) -> None:
        # (a failure every caller left before is read by asyncio.shield: it is not logged as unretrieved)
        if self._running.get(slot) is done:
            del self._running[slot]
