"""Writing usage events to the ledger from one background thread, in batches.

Each gateway process funnels its events through a single writer thread: it takes whatever has
queued up (up to BATCH events) and ingests them in one transaction, so a busy gateway commits once
per batch instead of once per request, and never has many threads fighting over the database
(with SQLite they would spin on its file lock). The sink (billing's `usage_record_ingest`) is
idempotent on the request id and uses a savepoint, so a batch that fails is simply retried event
by event, with backoff: a retry can never bill twice. The requests' usage-journal rows are
deleted in the same transaction as their ledger rows (journal.py).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, close_old_connections, transaction

from . import journal

log = logging.getLogger("tessera.gateway")

BATCH = 200
ATTEMPTS = 4
BACKOFF = 0.2  # seconds, doubled per attempt


class UsageWriter:
    def __init__(self, sink: Callable[..., object]) -> None:
        self.sink = sink
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
        self.thread.start()

    def submit(self, event) -> asyncio.Future:
        """Queue an event; the future resolves once it is written (or given up on, and logged)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((event, loop, future))
        return future

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            close_old_connections()
            try:
                self._write(batch)
            except Exception:  # never let the writer die
                log.exception("usage writer failed")
            finally:
                close_old_connections()
                for _, loop, future in batch:
                    if not loop.is_closed():
                        loop.call_soon_threadsafe(_resolve, future)

    def _write(self, batch: list) -> None:
        try:
            with transaction.atomic():
                for event, _, _ in batch:
                    self.sink(event=event)
                journal.forget(event.request_id for event, _, _ in batch)
            return
        except Exception:
            log.warning("usage batch failed; writing its %d events one by one", len(batch), exc_info=True)
        for event, _, _ in batch:
            self._write_one(event)

    def _write_one(self, event) -> None:
        delay = BACKOFF
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with transaction.atomic():
                    self.sink(event=event)
                    journal.forget([event.request_id])
                return
            except DatabaseError:  # transient: retrying the idempotent sink is safe
                close_old_connections()
                if attempt == ATTEMPTS:
                    log.exception("usage event NOT recorded", extra={"request_id": event.request_id, "event": repr(event)})
                    return
                time.sleep(delay)
                delay *= 2
            except Exception:  # refused (a producer bug): retrying cannot help
                log.exception("usage event refused", extra={"request_id": event.request_id, "event": repr(event)})
                return


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


_writers: dict[Callable, UsageWriter] = {}
_lock = threading.Lock()


def writer_for(sink: Callable[..., object]) -> UsageWriter:
    with _lock:
        if sink not in _writers:
            _writers[sink] = UsageWriter(sink)
        return _writers[sink]
