"""The whole GPU check rehearsed on the CPU (`--device cpu`): every phase's code on a 2-layer SmolLM2 cut
grown to 3 layers, at small sizes, with the padded graph-safe step where a GPU would replay graphs.

Its numbers mean nothing; what it proves is that the one command a lent GPU runs gets through each
phase, records what it should, and writes its report, before a GPU's minutes are spent on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gguf_truncate import truncate
from dataplane.models.registry import resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_every_phase_runs_and_reports(tmp_path):
    cut = tmp_path / "two.gguf"
    truncate(resolve_model_path("smollm2-135m-instruct"), cut, 2)
    results = tmp_path / "results"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--model", str(cut),
                           "--layers", "3", "--results-dir", str(results), "--work-dir", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]  # correct; the targets are a GPU's
    rec = json.loads((results / "gpu_check.json").read_text())
    assert rec["correct"] is True and rec["speed_model"].endswith("-3l.gguf")
    phases = rec["phases"]
    for name in ("setup", "graphs_vs_eager", "sweep", "profile", "prefill", "lora"):
        assert phases[name]["status"] == "ok", (name, phases[name])
    assert phases["kernels"]["status"].startswith("skipped") and phases["engine_vs_cpu"]["status"].startswith("skipped")
    gve = rec["graphs_vs_eager"]
    for part in ("float32", "float32, mixed LoRA", "bfloat16"):
        assert gve[part]["replays"] > 0 and len(gve[part]["checks"]) == gve[part]["prompts"]
    assert gve["warmup"]["steps"] > 0
    engine = {(r["mode"], r["batch"]) for r in rec["sweep"]["engine"]}
    assert engine == {("graphs", 1), ("graphs", 4), ("eager", 1), ("eager", 4), ("graphs, top-p", 4)}
    assert "Sampled (temperature 0.8, top_p 0.9" in (results / "gpu_check.md").read_text()
    assert [(r["batch"], r["graph"]) for r in rec["sweep"]["reference"]] == [(1, False), (4, False)]
    assert {(p["batch"], p["mode"]) for p in rec["profile"]} == {(2, "graphs"), (2, "eager")}
    assert all(p["replays"] == p["steps"] for p in rec["profile"] if p["mode"] == "graphs")
    assert [r["tokens"] for r in rec["prefill"]] == [16, 48]
    assert rec["lora"]["ratio"] > 0 and {r["mode"] for r in rec["lora"]["rows"]} == {"base", "mixed"}
    series = {p["series"] for p in rec["roofline"]["points"]}
    assert series == {"engine, CUDA graphs", "engine, eager", "plain torch, eager", "engine prefill (one prompt)"}
    assert ("written" in rec["roofline"]["png"]) == (results / "gpu_check_roofline.png").exists()
    assert len(rec["targets"]) == 8
    text = (results / "gpu_check.md").read_text()
    assert "A rehearsal on the CPU" in text and "## Targets" in text and "## Roofline" in text
    assert "== lora: ok" in proc.stdout  # progress printed as it goes
