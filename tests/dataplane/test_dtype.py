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


# -- weight_dtype: float16 storage under float32 compute (FBGEMM) ---------------------------------

@pytest.mark.parametrize("native,supported,expected", [
    (False, True, torch.float16),  # AVX2: float32 maths on float16 weights
    (False, False, None),  # no FBGEMM (not x86): plain float32
    (True, True, None),  # native bf16: auto is bf16, weights with it
])
def test_auto_weight_dtype_follows_auto_dtype_on_cpu(monkeypatch, native, supported, expected):
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(config, "fp16_weights_supported", lambda: supported)
    assert ModelConfig("m").torch_weight_dtype is expected


def test_explicit_float32_stays_exact_unless_float16_weights_are_asked(monkeypatch):
    monkeypatch.setattr(config, "fp16_weights_supported", lambda: True)
    assert ModelConfig("m", dtype="float32").torch_weight_dtype is None
    assert ModelConfig("m", dtype="float32", weight_dtype="float32").torch_weight_dtype is None
    assert ModelConfig("m", dtype="float32", weight_dtype="float16").torch_weight_dtype is torch.float16
    assert ModelConfig("m", dtype="bfloat16", weight_dtype="bfloat16").torch_weight_dtype is None


def test_auto_weight_dtype_on_cuda_is_the_dtype(monkeypatch):
    monkeypatch.setattr(config, "fp16_weights_supported", lambda: True)
    assert config.resolve_weight_dtype("auto", "auto", torch.bfloat16, "cuda") is None
    assert config.resolve_weight_dtype("auto", "float32", torch.float32, "cpu") is None


def test_unsupported_weight_dtypes_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(config, "fp16_weights_supported", lambda: True)
    with pytest.raises(ValueError, match="^weight_dtype: float16 weights under bfloat16 compute on cpu are not"):
        ModelConfig("m", dtype="bfloat16", weight_dtype="float16")
    with pytest.raises(ValueError, match="^weight_dtype: bfloat16 weights under float32"):
        ModelConfig("m", dtype="float32", weight_dtype="bfloat16")
    with pytest.raises(ValueError, match="^weight_dtype: 'int3' is not supported"):
        ModelConfig("m", weight_dtype="int3")
    monkeypatch.setattr(config, "fp16_weights_supported", lambda: False)
    with pytest.raises(ValueError, match="^weight_dtype: float16 weights under float32 compute need FBGEMM"):
        ModelConfig("m", dtype="float32", weight_dtype="float16")


def test_fp16_support_probe_agrees_with_the_cpu_and_the_op():
    """Where the probe says yes the op runs; on Linux x86 with AVX2 and an FBGEMM build it says yes."""
    supported = config.fp16_weights_supported()
    if supported:
        w, x = torch.randn(4, 3), torch.randn(2, 3)
        packed = torch.ops.quantized.linear_prepack_fp16(w, None)
        torch.testing.assert_close(torch.ops.quantized.linear_dynamic_fp16(x, packed), x @ w.half().float().T,
                                   atol=1e-5, rtol=1e-5)
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return  # not Linux: the op check above is all there is
    if "avx2" in flags and "f16c" in flags and "fbgemm" in torch.backends.quantized.supported_engines:
        assert supported
