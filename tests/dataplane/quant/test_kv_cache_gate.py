"""The quality gate on the FP8 KV cache (dataplane/quantize/gate.py, method kv_fp8) with the real SmolLM2."""

from __future__ import annotations

import pytest
import torch

from dataplane.quantize.gate import DEFAULT_THRESHOLDS, main, quality_gate
from kernels import kv_fp8
from tests.dataplane.conftest import MODEL


def test_the_fp8_cache_passes_its_gate_on_smollm2(smollm_bf16):
    report = quality_gate(MODEL, MODEL, kv_cache_dtype="fp8", dtype="bfloat16", baseline_model=smollm_bf16,
                          max_tokens=16)
    assert report.passed, report.reason
    assert report.method == "kv_fp8" and report.kv_cache_dtype == "fp8"
    assert report.thresholds == DEFAULT_THRESHOLDS["kv_fp8"]
    # It measured the cache, not the baseline against itself (the effect is small either way: -0.08% here)
    assert report.perplexity_increase != 0 and abs(report.perplexity_increase) <= 0.01
    assert 0 < report.mean_logprob_delta <= 0.15
    assert report.p99_logprob_delta >= report.mean_logprob_delta and report.greedy_agreement >= 0.9
    assert "log-probabilities within" in report.reason


def test_a_cache_that_loses_its_scales_is_refused(smollm_bf16, monkeypatch):
    # Every row stored with scale 1 whatever it holds: small rows round to 0, large ones saturate.
    quantize = kv_fp8.quantize

    def broken(x: torch.Tensor) -> torch.Tensor:
        rows = quantize(x)
        rows[..., -2:] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
        return rows

    monkeypatch.setattr(kv_fp8, "quantize", broken)
    report = quality_gate(MODEL, MODEL, kv_cache_dtype="fp8", dtype="bfloat16", baseline_model=smollm_bf16,
                          max_tokens=8)
    assert not report.passed
    assert "perplexity" in report.reason and "log-probabilities differ" in report.reason


def test_bad_kv_cache_dtypes_are_refused_by_the_gate_and_its_cli(capsys):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        quality_gate(MODEL, MODEL, kv_cache_dtype="int4")
    with pytest.raises(SystemExit):
        main(["--model", MODEL, "--baseline", MODEL, "--kv-cache-dtype", "int4"])
    assert "invalid choice" in capsys.readouterr().err
