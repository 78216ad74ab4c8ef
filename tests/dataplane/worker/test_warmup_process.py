"""A worker started with its warm-up: ready only once the shapes ran and its load curve was measured,
and its metrics start at zero."""

from __future__ import annotations

import httpx
import pytest

from .process import MODEL, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_warmed_up_worker_is_ready_with_zeroed_counters_then_counts_only_tenants():
    w = WorkerProcess("--warmup", "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--log-level", "info")
    try:
        w.wait_ready()
        assert "engine warmed up" in w.logs() and "load curve measured" in w.logs()
        # The load curve, for the capacity planner: behind the worker's token like /metrics.
        assert httpx.get(w.url + "/load_curve", timeout=10).status_code == 401
        curve = httpx.get(w.url + "/load_curve", headers=w.headers, timeout=10).json()
        assert [b for b, _ in curve["decode"]] == [1, 2, 4] and [n for n, _ in curve["prefill"]] == [32]
        assert curve["max_num_seqs"] == 4 and curve["threads"] >= 1 and curve["device"] == "cpu"
        m = w.metrics()
        assert m["tessera:prompt_tokens_total"] == 0 and m["tessera:generation_tokens_total"] == 0
        r = httpx.post(w.url + "/v1/completions", headers=w.headers, timeout=60, json={
            "model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "ignore_eos": True,
            "temperature": 0})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        m = w.metrics()
        assert m["tessera:generation_tokens_total"] == usage["completion_tokens"] == 5
        assert m["tessera:prompt_tokens_total"] == usage["prompt_tokens"]  # nothing cached from the warm-up
    finally:
        w.stop()


def test_no_load_curve_means_none_measured_and_a_404():
    w = WorkerProcess("--warmup", "--no-load-curve", "--max-num-seqs", "2", "--max-num-batched-tokens", "32",
                      "--log-level", "info")
    try:
        w.wait_ready()
        assert "engine warmed up" in w.logs() and "load curve measured" not in w.logs()
        r = httpx.get(w.url + "/load_curve", headers=w.headers, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    finally:
        w.stop()
