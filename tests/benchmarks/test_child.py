"""benchmarks.child: a benchmark's function run in a fresh process (common.run_child), not a `python -c` string."""

from __future__ import annotations

import os

from benchmarks.common import run_child


def test_a_function_runs_in_a_child_with_its_arguments_and_environment():
    assert run_child("benchmarks.common:percentile", values=[3.0, 1.0, 2.0], q=50) == 2.0
    assert run_child("os:getenv", env={"TESSERA_CHILD_PROBE": "seen"}, key="TESSERA_CHILD_PROBE") == "seen"
    assert run_child("os:getpid") != os.getpid()


def test_the_batch_benchmark_s_offline_engine_runs_as_a_function():
    result = run_child("benchmarks.batch_impact:offline_chat", lines=2, max_tokens=3)
    assert result["tokens"] == 2 * 3 and result["seconds"] > 0
