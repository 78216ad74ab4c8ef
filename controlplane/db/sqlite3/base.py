"""Django's SQLite backend, with one writer at a time per process waiting on a lock, not in SQLite.

SQLite lets one transaction write at a time; with `transaction_mode: IMMEDIATE` (our settings) a
writer takes the lock at BEGIN. Another thread that BEGINs meanwhile gets SQLITE_BUSY, and sqlite3's
busy handler then sleeps 1, 2, 5, 10, 15, 20, 25, … ms between tries, so a short wait behind a 3 ms
transaction can cost tens of milliseconds. Under `make run` a paying tenant's reservation waited
72 ms this way in the slowest tenth of its requests during a free-tier flood (benchmarks.flood's
Server-Timing, `limits`), behind the usage writer's batches and the flood's limiter calls.

So the threads of one process take turns on a lock first, which wakes the next at once; the busy
handler is left to what it is for, writers in other processes (Celery, another gateway). The lock
is held from BEGIN IMMEDIATE to COMMIT, ROLLBACK or the connection's close. A thread that cannot get
it within the connection's `timeout` goes ahead without it, to SQLite's own waiting, as before: a
transaction that waits on another thread's write can never hang here.

The turns go by priority, then arrival (turns.py, common/write_priority.py): a request's reservation
at its tier's priority, the usage writer's journal rows ahead (requests wait on them), ledger writes
and settlements last, so a paying tenant's reservation never waits behind a line of writes nobody is
waiting for.
"""

from __future__ import annotations

from django.db.backends.sqlite3 import base

from common import write_priority

from .turns import TurnLock

_writer = TurnLock()  # one per process: SQLite's write lock is per database file, we have one


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False

    def _writer_wait_seconds(self) -> float:
        return float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))

    def _start_transaction_under_autocommit(self) -> None:
        if self.transaction_mode != "IMMEDIATE" or self.is_in_memory_db():
            super()._start_transaction_under_autocommit()
            return
        self._holds_writer = _writer.acquire(write_priority.current.get(), self._writer_wait_seconds())
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        if self._holds_writer:
            self._holds_writer = False
            _writer.release()

    def _ending(self, end) -> None:  # noqa: ANN001
        """COMMIT, ROLLBACK or close: the transaction is over, whatever it raised."""
        try:
            end()
        finally:
            self._release_writer()

    def _commit(self) -> None:
        self._ending(super()._commit)

    def _rollback(self) -> None:
        self._ending(super()._rollback)

    def _close(self) -> None:
        self._ending(super()._close)
