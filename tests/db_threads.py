"""Running database work on a thread of its own in a test, as the gateway's executor does."""

from __future__ import annotations

import threading

from django.db import connections


def in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    """Start fn(*args) on a daemon thread; the dict gets its `value` or its `error` (the thread closes
    its database connections when done)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out
