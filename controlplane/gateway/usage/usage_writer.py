"""Writing the usage journal and the ledger from one background thread, in batches (group commit).

Each gateway process funnels its database writes on the request path through a single writer
thread: it takes whatever has queued up (up to BATCH items) — journal rows of requests about to be
sent to a worker, usage events of finished ones — and writes them in one transaction. A busy
gateway commits once per batch instead of once or twice per request, and never has many threads
fighting over the database (with SQLite they would spin on its file lock).

Usage events: the sink (billing's `usage_record_ingest`) is idempotent on the request id and uses
a savepoint, so a batch that fails is retried event by event, with backoff: a retry can never bill
twice. The requests' journal rows are deleted in the same transaction as their ledger rows.
Journal rows (`admit`) are latency-sensitive: a request waits for its row before it is sent. So a
batch's rows are committed first, in a transaction of their own, and their requests released before
the batch's events are written: a row never waits for up to BATCH ledger writes (one sink call
each). In a batch that fails they are written alone, and each one that still fails fails its request
(a 503 at the gateway) at once, before any event is retried.

While the database does not answer (PostgreSQL stopped, failing over, unreachable), a batch goes to
the process's local spool (spool.py) instead, fsync'd before anything waiting on it is released, so
requests keep being admitted and no served request goes unbilled. Once something is spooled,
everything after it is spooled too until the spool has been replayed (tried at most every
REPLAY_EVERY seconds), so the ledger sees the process's writes in order. A spool that is full (or a
disk that refuses) fails the batch's journal rows: those requests are refused, never served unbilled.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction

from common import write_priority
from controlplane.gateway import outages
from controlplane.gateway.dependencies import dependency_of
from controlplane.gateway.usage import journal, spool_metrics
from controlplane.gateway.usage.sink import is_async, usage_sink
from controlplane.gateway.usage.spool import (
    ADMIT,
    EVENT,
    MOVED,
    UNSETTLED,
    Moved,
    Spool,
    SpoolFull,
    Unsettled,
    replay_abandoned,
)

log = logging.getLogger("tessera.gateway")

BATCH = 200
ATTEMPTS = 4
BACKOFF = 0.2  # seconds, doubled per attempt
REPLAY_EVERY = 1.0  # seconds between attempts to replay the spool while the database is away
REPLAY_STEP = 100  # records replayed between two batches of new work (a few tens of ms of waiting, at most)
ABANDONED_EVERY = 30.0  # seconds between looks for dead processes' spool files
EVENT_KIND, ADMISSION, MARK, MOVE = EVENT, ADMIT, UNSETTLED, MOVED


class UsageWriter:
    def __init__(self, sink: Callable[..., object] | None) -> None:
        self.sink = sink  # None: a writer for journal rows only (the configured sink is async)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.spool = Spool(settings.TESSERA_USAGE_SPOOL_DIR, settings.TESSERA_USAGE_SPOOL_MAX_BYTES)
        self._replay_at = 0.0  # monotonic: no replay attempt before (set after a failed one)
        self._abandoned_at = 0.0
        self._closing = False  # close() was called: stop once the queue is empty
        self.thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
        self.thread.start()

    def submit(self, event) -> asyncio.Future:
        """Queue a usage event; the future resolves once it is written or spooled (or given up on, and logged)."""
        return self._put(EVENT_KIND, event)

    def admit(self, admission: journal.Admission) -> asyncio.Future:
        """Queue a journal row; the future resolves once it is committed or spooled, or raises why it could not be."""
        return self._put(ADMISSION, admission)

    def mark_unsettled(self, unsettled: Unsettled) -> asyncio.Future:
        """Queue a failed settlement's counts for the request's journal row (after its row, in order)."""
        return self._put(MARK, unsettled)

    def move(self, moved: Moved) -> asyncio.Future:
        """Queue a journal row's new worker (a retry after the first failed to connect), after the row."""
        return self._put(MOVE, moved)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread (what is spooled stays for the next writer, or any
        process's replay of a file nobody holds)."""
        self.queue.put(None)
        self.thread.join(timeout)

    def _put(self, kind: str, item) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((kind, item, loop, future))
        return future

    def _run(self) -> None:
        while True:
            replaying = self.spool.pending and time.monotonic() >= self._replay_at
            try:
                batch = [self.queue.get_nowait() if replaying else
                         self.queue.get(timeout=REPLAY_EVERY if self.spool.pending else ABANDONED_EVERY)]
            except queue.Empty:
                batch = []
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            self._closing = self._closing or None in batch
            batch = [entry for entry in batch if entry is not None]
            close_old_connections()
            try:
                self._housekeeping()
                if batch:
                    self._write(batch)
            except Exception as exc:  # never let the writer die
                log.exception("usage writer failed")
                for entry in batch:
                    if entry[0] == ADMISSION:
                        _settle(entry, exc)
            finally:
                close_old_connections()
                for entry in batch:
                    _settle(entry, None)  # no-op for the ones already settled
            if self._closing and self.queue.empty():
                return

    # --- the spool ---------------------------------------------------------------------------------

    def _housekeeping(self) -> None:
        """Replay our spool when due; now and then, replay dead processes' spool files."""
        now = time.monotonic()
        if self.spool.pending and now >= self._replay_at:
            self._try_replay(now)
        if not self.spool.pending and now >= self._abandoned_at:
            self._abandoned_at = now + ABANDONED_EVERY
            try:
                if applied := replay_abandoned(self.spool.directory, exclude=self.spool.path):
                    log.warning("replayed %d usage records a dead gateway process had spooled", applied)
            except Exception as exc:  # noqa: BLE001 - the database is away: next time
                if dependency_of(exc) is None:
                    log.exception("replaying abandoned usage spools failed")

    def _try_replay(self, now: float) -> bool:
        """One step of the replay; True once the spool is empty."""
        try:
            drained = self.spool.replay_step(REPLAY_STEP)
        except Exception as exc:  # noqa: BLE001 - still away: keep spooling, try again in a while
            close_old_connections()
            self._replay_at = now + REPLAY_EVERY
            if dependency_of(exc) is None:
                log.exception("usage spool replay failed")
            return False
        if drained:
            log.warning("database back: the usage spool is replayed")
        return drained

    def _to_spool(self, batch: list, reason: BaseException | None) -> None:
        """Spool the batch; on success everything waiting on it is released, else journal rows fail."""
        try:
            self.spool.append([(kind, item) for kind, item, _, _ in batch])
        except SpoolFull as exc:
            spool_metrics.SPOOL_REFUSED.inc()
            log.error("usage spool cannot take more; refusing new requests", extra={"error": str(exc)})
            for entry in batch:
                if entry[0] == ADMISSION:
                    _settle(entry, exc)  # that request is refused (503), never served unbilled
                elif entry[0] == EVENT_KIND:
                    # Its journal row is durable (database or spool): the sweeper bills it from the worker.
                    log.error("usage event NOT recorded; left to the sweeper", extra={"request_id": entry[1].request_id})
            return
        if reason is not None:
            outages.note_serving_from_memory("usage")
        spool_metrics.SPOOLED.inc(len(batch))

    # --- the database ------------------------------------------------------------------------------

    def _write(self, batch: list) -> None:
        if self.spool.pending:
            self._to_spool(batch, None)  # in order: nothing overtakes what is spooled
            return
        rest = [entry for entry in batch if entry[0] != ADMISSION]
        if rest and len(rest) < len(batch):
            # The journal rows first, in a transaction of their own, and their requests released at
            # once: a request waits for its row, not for the ledger writes of whatever finished at the
            # same time (up to BATCH events, each a sink call). Their order is kept: a row commits (or
            # is spooled) before anything after it, and a row's moves and marks come later anyway.
            admitted = [entry for entry in batch if entry[0] == ADMISSION]
            self._write(admitted)
            for entry in admitted:
                _settle(entry, None)  # a no-op for a row that failed: its request already has its error
            self._write(rest)
            return
        # Journal rows and moves have requests waiting on them: ahead of every other writer of the
        # process (common/write_priority.py); ledger writes and marks wait their turn.
        waited_on = any(entry[0] in (ADMISSION, MOVE) for entry in batch)
        with write_priority.turn(write_priority.REQUEST_PATH if waited_on else write_priority.BACKGROUND):
            self._commit(batch)

    def _commit(self, batch: list) -> None:
        admissions = [entry for entry in batch if entry[0] == ADMISSION]
        marks = [entry for entry in batch if entry[0] in (MARK, MOVE)]
        events = [entry for entry in batch if entry[0] == EVENT_KIND]
        try:
            with transaction.atomic():
                journal.insert([entry[1] for entry in admissions])
                for kind, mark, _, _ in marks:
                    _apply_mark(kind, mark)
                for _, event, _, _ in events:
                    self.sink(event=event)
                journal.forget(event.request_id for _, event, _, _ in events)
            return
        except Exception as exc:
            close_old_connections()
            if dependency_of(exc) == "database":
                log.warning("database unavailable; spooling usage", extra={"error": repr(exc)[:300]})
                self._replay_at = time.monotonic() + REPLAY_EVERY
                self._to_spool(batch, exc)
                return
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
        for kind, mark, _, _ in marks:
            try:
                _apply_mark(kind, mark)
            except Exception:  # noqa: BLE001 - the row stays as it was, for the sweeper
                close_old_connections()
                log.exception("could not update the journal row", extra={"request_id": mark.request_id})
        for entry in events:
            self._write_one(entry)

    def _write_one(self, entry) -> None:
        event = entry[1]
        delay = BACKOFF
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with transaction.atomic():
                    self.sink(event=event)
                    journal.forget([event.request_id])
                return
            except DatabaseError as exc:  # transient: retrying the idempotent sink is safe
                close_old_connections()
                if dependency_of(exc) == "database":
                    self._to_spool([entry], exc)  # replayed (idempotently) once the database answers
                    return
                if attempt == ATTEMPTS:  # its journal row stays: the sweeper bills it from the worker
                    log.exception("usage event NOT recorded; left to the sweeper",
                                  extra={"request_id": event.request_id, "event": repr(event)})
                    return
                time.sleep(delay)
                delay *= 2
            except Exception:  # refused (a producer bug): retrying cannot help
                log.exception("usage event refused", extra={"request_id": event.request_id, "event": repr(event)})
                return


def _apply_mark(kind: str, mark) -> None:
    if kind == MOVE:
        journal.move_sync(mark.request_id, mark.worker_url)
    else:
        journal.mark_unsettled_sync(mark.request_id, mark.prompt, mark.cached, mark.completion)


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


# --- the request path's entry points (journal rows and their updates, in order, through one writer) ---


def configured_sink() -> Callable[..., object] | None:
    """The configured ledger sink when it is a plain function (its writer thread takes the journal's
    rows too, so one thread writes everything), else None: a writer for journal rows only."""
    sink = usage_sink()
    return None if is_async(sink) else sink


async def admit(admission: journal.Admission) -> None:
    """Durable before it returns (committed, or spooled while the database is away); raises if neither
    can take it (the caller refuses the request)."""
    await writer_for(configured_sink()).admit(admission)


async def move(request_id: str, worker_url: str) -> None:
    """The request went to another worker (the first failed before accepting it); after its row."""
    await writer_for(configured_sink()).move(Moved(request_id, worker_url))


async def mark_unsettled(request_id: str, *, prompt: int, cached: int, completion: int) -> None:
    """The limiter could not be settled: keep the row, with the request's final counts, for the sweeper."""
    await writer_for(configured_sink()).mark_unsettled(Unsettled(request_id, prompt, cached, completion))
