"""Who goes first when several of a process's database writers wait for the one write lock.

On SQLite (make run) a process's writer threads take turns on a lock from BEGIN IMMEDIATE to COMMIT
(controlplane/db/sqlite3). First come, first served put a paying tenant's reservation behind the
free tier's settlements and the usage writer's ledger batches under a flood (benchmarks.flood). So
each write carries a priority, lower first, the tiers' own numbers (enterprise 0 … free 30): the
gateway sets its request's tier for everything the request writes on its way to the worker (a batch
line's: BACKGROUND, nobody waits on it online), the usage writer marks a batch of journal rows
(requests waiting on them) REQUEST_PATH, and everything nobody waits for (ledger rows, settlements,
heartbeats, admin edits) is BACKGROUND, the default.

A ContextVar, so that it follows a request into the executor thread that runs its ORM calls
(common.asyncdb.db_call copies the context) and never leaks into another request's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

REQUEST_PATH = 0  # a request is waiting on this write (its usage-journal row)
BACKGROUND = 1_000  # nobody waits on it

current: ContextVar[int] = ContextVar("tessera_write_priority", default=BACKGROUND)


@contextmanager
def turn(priority: int) -> Iterator[None]:
    """The writes inside take this turn; the one before comes back after, so a long-lived thread (the
    usage writer) does not carry a batch's turn into its later work (a spool replay)."""
    token = current.set(priority)
    try:
        yield
    finally:
        current.reset(token)
