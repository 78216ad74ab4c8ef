"""benchmarks/gpu_phases.py: each phase in its budget, its failure or timeout recorded, the results saved."""

from __future__ import annotations

import time

import pytest

from benchmarks.gpu_phases import Budget, PhaseTimeout, run_phase


def test_a_phase_result_is_kept_and_saved():
    record, saves = {}, []
    status = run_phase("a", 10, lambda budget: {"x": 1}, record, Budget(60), lambda: saves.append(dict(record)))
    assert status == "ok" and record["a"] == {"x": 1} and record["phases"]["a"]["status"] == "ok"
    assert saves and saves[-1]["phases"]["a"]["status"] == "ok"


def test_an_error_is_recorded_and_the_run_goes_on():
    record = {}

    def broken(budget):
        record["partial"] = [1]  # what it measured before failing stays
        raise ValueError("no such shape")

    status = run_phase("b", 10, broken, record, Budget(60), lambda: None)
    assert status.startswith("error: ValueError: no such shape") and record["partial"] == [1] and "b" not in record


def test_a_hung_phase_is_stopped_at_its_budget_even_inside_except_exception():
    record, rows = {}, []

    def hangs(budget):
        end = time.monotonic() + 3  # "forever" for this test: a timeout that never fires is a clean failure
        while time.monotonic() < end:
            try:  # as the engine's step does: one bad step must not end the engine
                rows.append(time.monotonic())
                time.sleep(0.01)
            except Exception:  # noqa: BLE001
                pass

    start = time.monotonic()
    status = run_phase("c", 0.3, hangs, record, Budget(60), lambda: None)
    assert status.startswith("timed out") and time.monotonic() - start < 2 and rows
    assert record["phases"]["c"]["budget"] <= 0.3


def test_budgets_nest_and_a_spent_run_skips_its_phases():
    overall = Budget(0.5)
    child = Budget(100, overall)
    assert child.left() <= 0.5 and not child.expired() and child.expired(1.0)
    ran = []
    status = run_phase("d", 10, lambda b: ran.append(1), {}, overall, lambda: None, min_start=5)
    assert status.startswith("skipped") and not ran


def test_the_timeout_is_not_an_exception_the_engine_would_swallow():
    assert not issubclass(PhaseTimeout, Exception)
    with pytest.raises(PhaseTimeout):
        try:
            raise PhaseTimeout()
        except Exception:  # noqa: BLE001
            pytest.fail("caught as an Exception")
