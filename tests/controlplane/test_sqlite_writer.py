"""make run's SQLite: a process's writers take turns on a lock that wakes the next at once, instead of
sqlite3's busy handler, which sleeps 1, 2, 5, ... 100 ms between tries (controlplane/db/sqlite3)."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from django.db import connections, transaction

from controlplane.db.sqlite3 import base
from tests.db_threads import in_thread as _in_thread

HOLD = 0.24  # s: the busy handler's tries fall at 228 and 328 ms, so it would come back ~90 ms late


@pytest.fixture
def alias(tmp_path, django_db_blocker):
    """A file database of its own, on our backend: not the test database (PostgreSQL in CI)."""
    django_db_blocker.unblock()
    name = "writer_test"
    connections.settings[name] = connections.configure_settings({"default": connections.settings["default"], name: {
        "ENGINE": "controlplane.db.sqlite3", "NAME": str(tmp_path / "w.sqlite3"),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"},
    }})[name]
    with connections[name].cursor() as c:
        c.execute("CREATE TABLE t (x INTEGER)")
    yield name
    connections[name].close()
    del connections[name]
    del connections.settings[name]
    django_db_blocker.restore()


def _gap(alias: str) -> float:
    """Seconds between one thread's commit and the next writer's BEGIN, that one having waited."""
    inside = threading.Event()

    def first():
        with transaction.atomic(using=alias):
            connections[alias].cursor().execute("INSERT INTO t VALUES (1)")
            inside.set()
            time.sleep(HOLD)
        return time.perf_counter()

    def second():
        inside.wait()
        with transaction.atomic(using=alias):
            entered = time.perf_counter()
            connections[alias].cursor().execute("INSERT INTO t VALUES (2)")
        return entered

    (a, out_a), (b, out_b) = _in_thread(first), _in_thread(second)
    a.join(10)
    b.join(10)
    assert "error" not in out_a and "error" not in out_b, (out_a, out_b)
    return out_b["value"] - out_a["value"]


def test_the_next_writer_begins_as_soon_as_the_first_commits(alias):
    gaps = [_gap(alias) for _ in range(3)]
    assert statistics.median(gaps) < 0.04, gaps  # the busy handler alone: ~0.09 s each
    assert not base._writer.locked()


def test_a_rolled_back_or_closed_transaction_lets_the_next_writer_in(alias):
    def fails():
        with transaction.atomic(using=alias):
            connections[alias].cursor().execute("INSERT INTO t VALUES (3)")
            raise ValueError("rolled back")

    t, out = _in_thread(fails)
    t.join(10)
    assert isinstance(out.get("error"), ValueError) and not base._writer.locked()

    def left_open():  # the thread's connection is closed inside its transaction (close_all in _in_thread)
        conn = connections[alias]
        conn.set_autocommit(True)
        conn._start_transaction_under_autocommit()
        assert base._writer.locked()

    t, out = _in_thread(left_open)
    t.join(10)
    assert "error" not in out, out
    assert not base._writer.locked()


def test_a_writer_that_cannot_get_the_lock_in_time_goes_ahead_to_sqlites_own_waiting(alias):
    connections.settings[alias]["OPTIONS"]["timeout"] = 0.2
    base._writer.acquire()  # a writer of this process that does not let go
    try:
        def write():
            started = time.perf_counter()
            with transaction.atomic(using=alias):
                connections[alias].cursor().execute("INSERT INTO t VALUES (4)")
            return time.perf_counter() - started

        t, out = _in_thread(write)
        t.join(10)
        assert "error" not in out, out
        assert 0.19 < out["value"] < 5  # waited its timeout for the lock, then wrote: never hangs
    finally:
        base._writer.release()


def test_waiting_writers_go_by_priority_then_arrival(alias):
    """Three writers queue while a fourth holds the lock: the request path's first, then the premium
    tier's, then the free tier's; two of one priority in the order they came. A writer nobody waits for
    (the default, BACKGROUND) comes last."""
    from common import write_priority

    held, order = threading.Event(), []
    release = threading.Event()

    def holder():
        with transaction.atomic(using=alias):
            connections[alias].cursor().execute("INSERT INTO t VALUES (0)")
            held.set()
            release.wait(10)

    def writer(name: str, priority: int | None):
        def run():
            if priority is not None:
                write_priority.current.set(priority)
            with transaction.atomic(using=alias):
                order.append(name)
                connections[alias].cursor().execute("INSERT INTO t VALUES (1)")
        return run

    h, _ = _in_thread(holder)
    held.wait(10)
    queued = [("background", None), ("free", 30), ("premium", 10), ("free, later", 30), ("journal", write_priority.REQUEST_PATH)]
    threads = []
    for name, priority in queued:  # each waiting before the next arrives
        threads.append(_in_thread(writer(name, priority)))
        deadline = time.monotonic() + 5
        while base._writer.waiting() < len(threads) and time.monotonic() < deadline:
            time.sleep(0.005)
    assert base._writer.waiting() == len(queued)
    release.set()
    for t, out in [(h, {}), *threads]:
        t.join(10)
        assert "error" not in out, out
    assert order == ["journal", "premium", "free", "free, later", "background"]
    assert not base._writer.locked()


def test_a_waiter_that_gave_up_is_passed_by():
    from controlplane.db.sqlite3.turns import TurnLock

    lock = TurnLock()
    assert lock.acquire(5, 1)
    assert lock.acquire(0, 0.05) is False  # timed out while held: not handed the lock later
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("ok", lock.acquire(9, 5)))
    t.start()
    while lock.waiting() < 1:
        time.sleep(0.005)
    lock.release()
    t.join(5)
    assert got == {"ok": True} and lock.locked()  # the live waiter got it, the one that left did not
    lock.release()
    assert not lock.locked() and lock.waiting() == 0
