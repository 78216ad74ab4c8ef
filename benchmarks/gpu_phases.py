"""Phases of the GPU check, each inside its own time budget, the results written after every one.

Why: a lent GPU is held for minutes, and a run cut short by its command's time limit must still leave
what it measured. Each phase gets min(its budget, what the whole run has left); it checks its Budget
between measurements and stops early when it runs short (cooperative), and on the main thread an
interval timer raises PhaseTimeout in it when the budget is spent (a hard stop between two Python
bytecodes: a single kernel or C call that hangs is not interrupted, the command's own time limit is
the last resort). A phase that fails or times out is recorded as such and the next phase runs.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


class PhaseTimeout(BaseException):
    """A BaseException, as KeyboardInterrupt is: the engine's `except Exception` around a step (one bad
    step fails its requests, the engine goes on) must not swallow the end of a phase."""


class Budget:
    """A deadline: `left()` seconds remain; a child budget never outlives its parent."""

    def __init__(self, seconds: float, parent: Budget | None = None) -> None:
        deadline = time.monotonic() + seconds
        self.deadline = min(deadline, parent.deadline) if parent is not None else deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self, need: float = 0.0) -> bool:
        """Whether fewer than `need` seconds are left."""
        return self.left() < need


def run_phase(name: str, seconds: float, fn: Callable[[Budget], Any], record: dict, overall: Budget,
              save: Callable[[], None], min_start: float = 5.0) -> str:
    """Run `fn(budget)`; its return value (if not None) goes to record[name]. The phase's status goes to
    record["phases"][name]; `save` runs afterwards whatever happened. Returns the status."""
    phases = record.setdefault("phases", {})
    if overall.expired(min_start):
        phases[name] = {"status": "skipped: the run's time budget is spent", "seconds": 0.0, "budget": 0.0}
        print(f"== {name}: skipped (no time left)", flush=True)
        save()
        return phases[name]["status"]
    budget = Budget(seconds, overall)
    allowed = budget.left()
    print(f"== {name} (budget {allowed:.0f} s)", flush=True)
    start = time.monotonic()
    status = "ok"
    with _alarm(allowed):
        try:
            result = fn(budget)
            if result is not None:
                record[name] = result
        except PhaseTimeout:
            status = f"timed out after {allowed:.0f} s (what it measured before is kept)"
        except Exception as exc:  # noqa: BLE001 - one phase's failure must not lose the others
            traceback.print_exc()
            status = f"error: {type(exc).__name__}: {str(exc)[:300]}"
    took = time.monotonic() - start
    phases[name] = {"status": status, "seconds": round(took, 1), "budget": round(allowed, 1)}
    print(f"== {name}: {status} ({took:.1f} s)", flush=True)
    save()
    return status


class _alarm:
    """SIGALRM -> PhaseTimeout after `seconds`, on the main thread only (signals reach no other)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = max(seconds, 0.001)
        self.armed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")

    def __enter__(self) -> _alarm:
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, _raise_timeout)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> bool:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return exc_type is PhaseTimeout  # fired after the phase's own handler: the phase had finished


def _raise_timeout(signum: int, frame: object) -> None:
    raise PhaseTimeout()
