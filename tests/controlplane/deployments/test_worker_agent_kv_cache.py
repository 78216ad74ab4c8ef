"""The agent serves a replica on an FP8 KV cache only after the cache's quality gate passes it."""

from __future__ import annotations

import types

from dataplane.worker.agent import slot as slot_module

from .test_worker_agent import agent, spec  # noqa: F401 - the fixture and the spec builder


def fake_gate(monkeypatch, verdicts: dict) -> list:
    calls: list = []

    def quality_gate(candidate, baseline, method=None, quantization=None, kv_cache_dtype="auto", **kw):
        calls.append({"candidate": candidate, "baseline": baseline, "method": method, "quantization": quantization,
                      "kv_cache_dtype": kv_cache_dtype, **kw})
        which = "kv" if kv_cache_dtype != "auto" else "weights"
        return types.SimpleNamespace(passed=verdicts[which], reason=f"{which} perplexity +2%")

    monkeypatch.setattr(slot_module, "quality_gate", quality_gate)
    return calls


def with_args(s: dict, **engine_args) -> dict:
    return {**s, "engine_args": engine_args}


def test_an_fp8_cache_that_fails_its_gate_never_serves(agent, monkeypatch):  # noqa: F811
    verdicts = {"kv": False, "weights": True}
    calls = fake_gate(monkeypatch, verdicts)
    agent.control.specs[1] = with_args(spec(), kv_cache_dtype="fp8")
    assert agent.runner.load_model(1, 1) == "failed"
    body = agent.control.reports[-1][1]
    assert body["permanent"] and "quality gate failed for the fp8 KV cache" in body["reason"]
    assert body["gate"]["passed"] is False and agent.slot.counters["engine_builds"] == 0
    assert calls == [{"candidate": "smollm2-135m-instruct", "baseline": "smollm2-135m-instruct", "method": None,
                      "quantization": None, "kv_cache_dtype": "fp8", "dtype": "auto"}]
    verdicts["kv"] = True
    agent.control.specs[1] = with_args(spec(attempt=2), kv_cache_dtype="fp8")
    assert agent.runner.load_model(1, 2) == "loaded"
    assert agent.control.reports[-1][1]["gate"]["passed"] is True


def test_the_model_cache_runs_no_gate_and_weights_and_cache_gates_both_run(agent, monkeypatch):  # noqa: F811
    verdicts = {"kv": True, "weights": True}
    calls = fake_gate(monkeypatch, verdicts)
    agent.control.specs[1] = spec()
    assert agent.runner.load_model(1, 1) == "loaded" and calls == []
    agent.control.specs[2] = with_args(spec(replica_id=2, quantization="fp8"), kv_cache_dtype="fp8")
    assert agent.runner.load_model(2, 1) == "loaded"
    # the weights' gate, then the cache's on the same quantized-at-load model
    assert [c["kv_cache_dtype"] for c in calls] == ["auto", "fp8"] and calls[1]["quantization"] == "fp8"
    gate = agent.control.reports[-1][1]["gate"]
    assert gate["passed"] and "kv cache: kv perplexity" in gate["reason"] and gate["kv_cache"]["kv_cache_dtype"] == "fp8"
