"""Writing the usage journal and the ledger from one background thread, in batches (group commit).

Each gateway process funnels its database writes on the request path through a single writer
thread: it takes whatever has queued up (up to BATCH items) — journal rows of requests about to be
sent to a worker, usage events of finished ones — and writes them in one transaction. A busy
gateway commits once per batch instead of once or twice per request, and never has many threads
fighting over the database (with SQLite they would spin on its file lock).

Usage events: the sink (billing's `usage_record_ingest`) is idempotent on the request id and uses
a savepoint, so a batch that fails is retried event by event, with backoff: a retry can never bill
twice. The requests' journal rows are deleted in the same transaction as their ledger rows.
Journal rows (`admit`) are latency-sensitive: a request waits for its row before it is sent. In a
batch that fails they are written alone, first, and each one that still fails fails its request
(a 503 at the gateway) at once, before any event is retried.
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
EVENT, ADMISSION = "event", "admission"


class UsageWriter:
    def __init__(self, sink: Callable[..., object] | None) -> None:
        self.sink = sink  # None: a writer for journal rows only (the configured sink is async)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
        self.thread.start()

    def submit(self, event) -> asyncio.Future:
        """Queue a usage event; the future resolves once it is written (or given up on, and logged)."""
        return self._put(EVENT, event)

    def admit(self, admission: journal.Admission) -> asyncio.Future:
        """Queue a journal row; the future resolves once it is committed, or raises why it could not be."""
        return self._put(ADMISSION, admission)

    def _put(self, kind: str, item) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((kind, item, loop, future))
        return future

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            admissions = [entry for entry in batch if entry[0] == ADMISSION]
            events = [entry for entry in batch if entry[0] == EVENT]
            close_old_connections()
            try:
                self._write(admissions, events)
            except Exception as exc:  # never let the writer die
                log.exception("usage writer failed")
                for entry in admissions:
                    _settle(entry, exc)
            finally:
                close_old_connections()
                for entry in batch:
                    _settle(entry, None)  # no-op for the ones already settled

    def _write(self, admissions: list, events: list) -> None:
        try:
            with transaction.atomic():
                journal.insert([entry[1] for entry in admissions])
                for _, event, _, _ in events:
                    self.sink(event=event)
                journal.forget(event.request_id for _, event, _, _ in events)
            return
        except Exception:
            log.warning("usage batch failed; writing its %d journal rows and %d events one by one",
                        len(admissions), len(events), exc_info=True)
        for entry in admissions:
            try:
                with transaction.atomic():
                    journal.insert([entry[1]])
            except Exception as exc:  # noqa: BLE001 - handed to the waiting request (a 503)
                close_old_connections()
                _settle(entry, exc)
            else:
                _settle(entry, None)
        for _, event, _, _ in events:
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


def _settle(entry: tuple, error: BaseException | None) -> None:
    _, _, loop, future = entry
    if not loop.is_closed():
        loop.call_soon_threadsafe(_resolve, future, error)


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


_writers: dict[Callable | None, UsageWriter] = {}
_lock = threading.Lock()


def writer_for(sink: Callable[..., object] | None) -> UsageWriter:
    with _lock:
        if sink not in _writers:
            _writers[sink] = UsageWriter(sink)
        return _writers[sink]
