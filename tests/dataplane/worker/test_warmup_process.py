"""A worker started with its warm-up: ready only once the shapes ran, and its metrics start at zero."""

from __future__ import annotations

import httpx
import pytest

from .process import MODEL, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_warmed_up_worker_is_ready_with_zeroed_counters_then_counts_only_tenants():
    w = WorkerProcess("--warmup", "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--log-level", "info")
    try:
        w.wait_ready()
        assert "engine warmed up" in w.logs()
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
