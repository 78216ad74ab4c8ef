"""Admission and drain: count in-flight requests, stop admitting on SIGTERM, wait for the rest.

A request holds a `Ticket` from admission until its response is fully sent (for a stream, until
`[DONE]` went out or the client left). `drain()` flips the worker to not-ready (new requests get
503, `/ready` answers 503) and returns once nothing is in flight or the timeout passed.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("tessera.worker")


class Draining(Exception):
    """Raised by `admit()` once a drain has started."""


class Ticket:
    __slots__ = ("_drainer", "_held")

    def __init__(self, drainer: Drainer) -> None:
        self._drainer = drainer
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._drainer._release()


class Drainer:
    def __init__(self) -> None:
        self.draining = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def admit(self) -> Ticket:
        if self.draining:
            raise Draining
        self.inflight += 1
        self._idle.clear()
        return Ticket(self)

    def _release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Stop admitting; True when every in-flight request finished within `timeout` seconds."""
        self.draining = True
        started = time.monotonic()
        log.info("draining", extra={"inflight": self.inflight, "timeout_s": timeout})
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("drain timed out", extra={"inflight": self.inflight, "timeout_s": timeout})
            return False
        log.info("drained", extra={"seconds": round(time.monotonic() - started, 3)})
        return True
