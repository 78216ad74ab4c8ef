"""One log line when a dependency goes away, one a minute while it stays away, one when it is back.

Beat ticks every few seconds and each tick that cannot reach the broker (or each reconcile pass that
cannot reach the database) would otherwise write a multi-hundred-line traceback: minutes of outage
became megabytes of log that hid the first, useful line. An `OutageLog` keeps that first line (with
the error), then says every `every` seconds how many failures it swallowed, then how long it lasted.
Thread-safe: beat, the Celery pool's threads and the web's request threads share one per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

OUTAGE_LOG_EVERY_SECONDS = 60.0


class OutageLog:
    def __init__(self, logger: logging.Logger, what: str, every: float = OUTAGE_LOG_EVERY_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what, self.every, self.clock = logger, what, every, clock
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time of the first failure of this outage
        self._last_line = 0.0
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException, **extra) -> None:
        with self._lock:
            now = self.clock()
            self._failures += 1
            if self._since is None:
                self._since, self._last_line = now, now
                self.log.warning("%s unavailable", self.what,
                                 extra={**extra, "error": f"{type(exc).__name__}: {exc}", "outage": self.what})
            elif now - self._last_line >= self.every:
                self._last_line = now
                self.log.warning("%s still unavailable", self.what,
                                 extra={**extra, "error": f"{type(exc).__name__}: {exc}", "outage": self.what,
                                        "seconds": round(now - self._since, 1), "failures": self._failures})

    def succeeded(self, **extra) -> None:
        if self._since is None:  # the common case: no lock, no line
            return
        with self._lock:
            if self._since is None:
                return
            seconds, failures = self.clock() - self._since, self._failures
            self._since, self._failures = None, 0
        self.log.warning("%s available again", self.what,
                         extra={**extra, "outage": self.what, "seconds": round(seconds, 1), "failures": failures})
