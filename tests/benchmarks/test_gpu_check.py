"""benchmarks.gpu_check on a host without CUDA, and its engine comparison on hand-built logprobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_compare import compare_sequences
from dataplane.scheduler.output import TokenLogprobs

ROOT = Path(__file__).resolve().parents[2]


def _seq(tokens: list[tuple[int, float, list[tuple[int, float]]]]) -> list[TokenLogprobs]:
    return [TokenLogprobs(t, lp, top) for t, lp, top in tokens]


def test_without_cuda_it_says_so_and_exits_0() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout


def test_identical_sequences_pass() -> None:
    cpu = _seq([(5, -0.1, [(5, -0.1), (7, -2.5)]), (9, -0.3, [(9, -0.3), (2, -1.9)])])
    check = compare_sequences(0, cpu, cpu)
    assert check.ok and check.compared == 2 and check.diverged_at is None and check.max_logprob_err == 0


def test_logprob_drift_beyond_tolerance_fails() -> None:
    cpu = _seq([(5, -0.1, [(5, -0.1), (7, -2.5)])])
    gpu = _seq([(5, -0.1, [(5, -0.1), (7, -2.6)])])  # an alternative's logprob off by 0.1
    check = compare_sequences(0, cpu, gpu)
    assert not check.ok and abs(check.max_logprob_err - 0.1) < 1e-9


def test_a_different_greedy_token_fails_unless_it_is_a_near_tie() -> None:
    cpu = _seq([(5, -0.1, [(5, -0.1), (7, -2.5)]), (9, -0.69, [(9, -0.69), (2, -0.695)])])
    flipped_clear = _seq([(7, -2.5, [(7, -2.5), (5, -0.1)])])
    check = compare_sequences(1, cpu, flipped_clear)
    assert not check.ok and check.diverged_at == 0 and not check.near_tie
    flipped_tie = _seq([(5, -0.1, [(5, -0.1), (7, -2.5)]), (2, -0.69, [(2, -0.69), (9, -0.692)])])
    check = compare_sequences(1, cpu, flipped_tie)
    assert check.ok and check.near_tie and check.diverged_at == 1 and check.compared == 1


def test_a_shorter_gpu_sequence_fails() -> None:
    cpu = _seq([(5, -0.1, []), (9, -0.3, [])])
    assert not compare_sequences(0, cpu, cpu[:1]).ok
