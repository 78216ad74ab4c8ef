"""benchmarks.step_overhead still measures this tree: its engine splits the step from the output
processing, and the forward's time is taken out of the step's."""

from __future__ import annotations

from benchmarks.step_overhead import measure


def test_measure_splits_the_step_and_the_forward():
    got = measure([1, 4], steps=3)
    assert set(got) == {"greedy", "sampled"}
    for per_batch in got.values():
        assert set(per_batch) == {"1", "4"}
        for m in per_batch.values():
            assert m["cpu"] > 0 and 0 < m["forward"] < m["cpu"]
            assert m["host"] > 0 and m["off"] > 0  # outputs processed apart from the step
            assert m["total"] >= m["cpu"]
