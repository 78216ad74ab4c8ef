"""One call in flight per key: the callers that ask while it runs share its result.

Why: a burst of requests that all miss the same cache (a new client's first second, or every time a
cached entry expires under load) each ran the same database query side by side, and filled the
gateway's database threads that every other tenant's request then waited for. One query serves them
all. Each event loop has its own calls (a future belongs to the loop that made it).

The first caller runs the call itself (no task of its own to schedule): a lone cache miss, the
common case, costs what it cost before, with no extra turn of a busy event loop (under a free-tier
flood a turn is a queue of refusals). Only callers that join wait on a shared future. (A first
version with a task per call measured 1.52x against 1.43x in benchmarks.flood; a second A/B put both
inside the run-to-run spread, history/flood.md. Not paying the turn is free either way.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _LeaderLeft(Exception):
    """The caller running the call was cancelled (its client left): the others ask again."""


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._running: dict[tuple[int, Hashable], asyncio.Future[T]] = {}

    async def run(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s result, from the call already in flight for `key` on this loop if there is one.
        A joining caller that leaves does not cancel the call; if the caller running it leaves, the
        call stops with it and the others ask again (one of them runs it)."""
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        while (shared := self._running.get(slot)) is not None and shared.get_loop() is loop:
            try:
                return await asyncio.shield(shared)  # shielded: leaving does not cancel it for the rest
            except _LeaderLeft:
                continue
        shared = self._running[slot] = loop.create_future()  # (a closed loop's id may be reused)
        try:
            result = await call()
        except BaseException as exc:
            shared.set_exception(_LeaderLeft() if isinstance(exc, asyncio.CancelledError) else exc)
            shared.exception()  # read here: with nobody joined, it is not logged as never retrieved
            raise
        else:
            shared.set_result(result)
            return result
        finally:
            if self._running.get(slot) is shared:
                del self._running[slot]

    def in_flight(self) -> int:
        return len(self._running)
