"""The scheduler's `max_loras` constraint, fair across adapters.

At most `max_loras` distinct adapters may have running requests (each needs a device slot for
every step it is scheduled in). Admitting only requests whose adapter is already running would
starve a rare adapter behind popular ones that always have a request running, so when a waiting
request's adapter finds every slot taken, one running adapter is *retired*: it admits nothing new
until its running requests finish, and its slot then goes to the earliest-ranked blocked adapter.
A retired adapter drains within one request lifetime, so no adapter waits forever; adapters not
retired keep admitting meanwhile, so the constraint costs little throughput. The victim is the
running adapter with the fewest waiting requests (retiring it holds back the least work), then
the fewest running ones (it drains soonest), then by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from dataplane.request import Request


class AdapterAdmission:
    """One scheduling step's view; `retiring` is the scheduler's set, kept across steps."""

    def __init__(self, max_loras: int, running: Iterable[Request], retiring: set[str],
                 waiting: Iterable[Request]) -> None:
        self.max_loras = max_loras
        self.retiring = retiring
        self.waiting = waiting
        self._waiting_counts: Counter[str] | None = None  # counted only if someone must be retired
        self.blocked: set[str] = set()  # adapters refused a slot in this step
        self.refresh(running)

    def refresh(self, running: Iterable[Request]) -> None:
        """Recount after the running set changed behind our back (a preemption)."""
        self.counts = Counter(r.adapter for r in running if r.adapter is not None)
        self.retiring.intersection_update(self.counts)  # a drained adapter is no longer retiring

    def admits(self, adapter: str | None) -> bool:
        if adapter is None:
            return True
        if adapter in self.retiring:
            return False
        if adapter in self.counts or len(self.counts) < self.max_loras:
            return True
        if adapter not in self.blocked:
            self.blocked.add(adapter)
            if len(self.retiring) < len(self.blocked):
                candidates = [a for a in self.counts if a not in self.retiring]
                if candidates:
                    if self._waiting_counts is None:
                        self._waiting_counts = Counter(r.adapter for r in self.waiting if r.adapter is not None)
                    waiting = self._waiting_counts
                    self.retiring.add(min(candidates, key=lambda a: (waiting[a], self.counts[a], a)))
        return False

    def admitted(self, adapter: str | None) -> None:
        if adapter is not None:
            self.counts[adapter] += 1
