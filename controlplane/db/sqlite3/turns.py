"""A lock whose waiters get it in order of priority (lower first), then of arrival.

The process's SQLite writers wait here (base.py). A release hands the lock straight to the best
waiter, so a later, more urgent writer cannot be overtaken by one that merely woke first, and a
waiter that gives up (its timeout) is skipped, never handed the lock.
"""

from __future__ import annotations

import heapq
import itertools
import threading


class _Waiter:
    __slots__ = ("priority", "seq", "granted", "gave_up")

    def __init__(self, priority: int, seq: int) -> None:
        self.priority, self.seq = priority, seq
        self.granted = threading.Event()
        self.gave_up = False

    def __lt__(self, other: _Waiter) -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


class TurnLock:
    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    def acquire(self, priority: int = 0, timeout: float | None = None) -> bool:
        """Wait for the lock at most `timeout` seconds (None: as long as it takes); whether it is held now."""
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            waiter = _Waiter(priority, next(self._arrivals))
            heapq.heappush(self._waiting, waiter)
        if waiter.granted.wait(timeout):
            return True
        with self._mutex:
            if waiter.granted.is_set():  # handed over just as the wait ran out
                return True
            waiter.gave_up = True  # release() passes it by
            return False

    def release(self) -> None:
        with self._mutex:
            while self._waiting:
                waiter = heapq.heappop(self._waiting)
                if not waiter.gave_up:
                    waiter.granted.set()  # held all along: ownership passes to it
                    return
            self._held = False

    def locked(self) -> bool:
        with self._mutex:
            return self._held

    def waiting(self) -> int:
        """Writers waiting now (those that gave up not counted)."""
        with self._mutex:
            return sum(not w.gave_up for w in self._waiting)
