"""benchmarks/gpu_report.py: targets judged from a run's record, and the report of a partial run."""

from __future__ import annotations

from benchmarks.gpu_report import correctness_ok, render, targets


def _check(ok=True, near_tie=False, prompt=0):
    return {"prompt": prompt, "compared": 8, "max_logprob_err": 1e-5, "diverged_at": None if ok and not near_tie else 3,
            "near_tie": near_tie, "ok": ok}


def _record(**over):
    rec = {
        "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-01", "model": "cut.gguf",
        "speed_model": "cut-30l.gguf", "speed_layers": 30, "speed_dtype": "bfloat16",
        "phases": {"sweep": {"status": "ok", "seconds": 40.0, "budget": 100.0}},
        "sweep": {"params": {"prompt_len": 32, "output_tokens": 128},
                  "engine": [{"batch": 1, "mode": "graphs", "tok_s": 700.0, "step_ms": 1.4, "replays": 127},
                             {"batch": 1, "mode": "eager", "tok_s": 60.0, "step_ms": 16.0, "replays": None},
                             {"batch": 32, "mode": "graphs", "tok_s": 12_000.0, "step_ms": 2.6, "replays": 127},
                             {"batch": 128, "mode": "graphs", "tok_s": 60_000.0, "step_ms": 2.1, "replays": 127}],
                  "reference": [{"batch": 1, "graph": True, "tok_s": 1000.0, "ms": 1.0, "ctx": 96},
                                {"batch": 32, "graph": True, "tok_s": 25_000.0, "ms": 1.28, "ctx": 96},
                                {"batch": 128, "graph": True, "tok_s": 85_000.0, "ms": 1.5, "ctx": 96}]},
        "lora": {"adapters": 8, "rank": 16, "batch": 32, "rows": [], "base_tok_s": 12_000.0, "mixed_tok_s": 10_000.0,
                 "ratio": 10 / 12},
        "graphs_vs_eager": {"float32": {"checks": [_check(), _check(prompt=1)], "replays": 40, "tolerance": 2e-3,
                                        "prompts": 2, "max_tokens": 8},
                            "bfloat16": {"checks": [_check(), _check(near_tie=True, prompt=1)], "replays": 40,
                                         "tolerance": 3e-2, "prompts": 2, "max_tokens": 8}},
    }
    rec.update(over)
    return rec


def _by_name(rec):
    return {t.name: t for t in targets(rec)}


def test_targets_pass_fail_and_share_of_the_reference():
    t = _by_name(_record())
    assert t["batch 1 >= 600 tok/s (CUDA graphs)"].ok is True
    assert "70% of the plain-torch graph step's 1,000" in t["batch 1 >= 600 tok/s (CUDA graphs)"].detail
    assert t["batch 1 >= 60% of the plain-torch graph step"].ok is True
    assert t["batch 32 >= 16,000 tok/s (CUDA graphs)"].ok is False
    assert t["batch 32 >= 60% of the plain-torch graph step"].ok is False  # 48 %
    assert t["batch 128 >= 50,000 tok/s (CUDA graphs)"].ok is True
    assert t["batch 128 >= 60% of the plain-torch graph step"].ok is True  # 71 %
    assert t["8 LoRA adapters mixed in a batch of 32 >= 80% of base (CUDA graphs)"].ok is True
    same = t["identical greedy tokens with and without graphs"]
    assert same.ok is True and "1 near-tie" in same.detail


def test_a_divergence_or_no_graph_step_fails_identical_tokens():
    rec = _record()
    rec["graphs_vs_eager"]["float32"]["checks"][1] = _check(ok=False, prompt=1)
    assert _by_name(rec)["identical greedy tokens with and without graphs"].ok is False
    assert correctness_ok(rec) is False
    rec = _record()
    rec["graphs_vs_eager"]["bfloat16"]["replays"] = 0  # the "graphs" engine never ran a graph: nothing compared
    same = _by_name(rec)["identical greedy tokens with and without graphs"]
    assert same.ok is False and "NO decode step went through a graph in bfloat16" in same.detail
    assert correctness_ok(rec) is False


def test_missing_measurements_are_not_passes():
    rec = _record(lora={}, sweep={}, graphs_vs_eager={})
    assert all(t.ok is None for t in targets(rec))
    assert correctness_ok(rec) is None
    text = render(rec)
    assert "**NOT MEASURED** batch 1 >= 600 tok/s" in text and "Correctness: **not run**" in text


def test_the_report_of_a_partial_run():
    rec = _record(findings=["warm-up reported 10 CUDA graphs for 5 batch sizes"])
    text = render(rec)
    assert "targets met: **6 of 8**" in text and "- **FAIL** batch 32 >= 16,000 tok/s" in text
    assert "| 1 | 700 | 1.40 | 60 | 16.00 | 11.67x | 1,000 | 1.000 | 0.70x | 0.71x | – | 127 |" in text
    assert "## Findings of this run" in text and "warm-up reported 10" in text
    assert "## Where a decode step goes" not in text  # the profile did not run: no empty section
