"""dtype='auto' picks what the device computes natively: bf16 only where the CPU has it in hardware."""

from __future__ import annotations

import pytest
import torch

from dataplane import config
from dataplane.config import ModelConfig, cpu_has_native_bf16, resolve_dtype


@pytest.mark.parametrize("native,expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_cpu_follows_native_bf16(monkeypatch, native, expected):
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: native)
    assert resolve_dtype("auto") is expected
    assert ModelConfig("m", dtype="auto").torch_dtype is expected


def test_auto_on_cuda_prefers_bf16_then_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda:0") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda") is torch.float16


def test_named_dtypes_are_kept_whatever_the_cpu(monkeypatch):
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: False)
    assert ModelConfig("m", dtype="bfloat16").torch_dtype is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="^dtype: 'int8' is not supported"):
        ModelConfig("m", dtype="int8")


def test_native_bf16_probe_agrees_with_the_cpu_flags():
    """The probe reads torch's own CPU feature checks; on Linux they match /proc/cpuinfo."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags on this platform")
    assert cpu_has_native_bf16() == ("avx512_bf16" in flags or "amx_tile" in flags)
