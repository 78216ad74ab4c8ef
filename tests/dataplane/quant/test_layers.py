"""Quantized linear layers against their dequantized dense twins (and the quantization error bounds)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dataplane.quant import DenseLinear, Fp8Linear, Int4Linear, Int8Linear, LinearLayer
from kernels.awq_layout import awq_dequantize, awq_quantize
from kernels.reference import awq_gemm_ref, quantize_fp8_per_channel

# Shapes from SmolLM2: qkv fused (960 = 576 + 2 * 192), gate_up fused, down.
SHAPES = [(960, 576), (3072, 576), (576, 1536)]


def _weight(n: int, k: int) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) / k**0.5


def _close(actual: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    """Errors of dot products scale with the outputs' magnitude, not each output's own size."""
    scale = float(expected.float().abs().max())
    torch.testing.assert_close(actual.float(), expected.float(), atol=rel * scale, rtol=rel)


def test_dense_linear_is_f_linear() -> None:
    w = _weight(64, 32).bfloat16()
    layer = DenseLinear(w)
    x = torch.randn(3, 5, 32).bfloat16()
    assert torch.equal(layer(x), F.linear(x, w))
    assert layer.weight_bytes == 64 * 32 * 2 and isinstance(layer, LinearLayer)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("m", [1, 32])
def test_int4_matches_its_dense_twin(n, k, group_size, m) -> None:
    layer = Int4Linear.from_float(_weight(n, k), group_size)
    x = torch.randn(m, k).bfloat16()
    twin = layer.dense_weight()
    _close(layer(x), F.linear(x.float(), twin).bfloat16(), 1e-2)
    # Packed in memory: 4 bits per weight plus a bf16 scale and zero per group and column.
    assert layer.weight_bytes == n * k // 2 + (k // group_size) * n * 2 * 2
    assert isinstance(layer, LinearLayer)


def test_int4_from_awq_checkpoint_tensors_matches_the_awq_reference() -> None:
    qweight, qzeros, scales = awq_quantize(_weight(192, 576), group_size=64)
    layer = Int4Linear.from_awq(qweight, qzeros, scales, 64)
    x = torch.randn(4, 576).bfloat16()
    # Scales and zeros go from fp16 to bf16 for the CPU op: about 2^-9 relative per weight.
    _close(layer(x), awq_gemm_ref(x, qweight, qzeros, scales, 64), 1e-2)
    torch.testing.assert_close(layer.dense_weight(), awq_dequantize(qweight, qzeros, scales, 64).t(),
                               atol=2e-3, rtol=1e-2)


def test_int4_round_to_nearest_error_is_half_a_step() -> None:
    w = _weight(64, 128)
    layer = Int4Linear.from_float(w, 32, dtype=torch.float32)
    step = (w.view(64, 4, 32).amax(-1) - w.view(64, 4, 32).amin(-1)) / 15
    err = (layer.dense_weight() - w).abs().view(64, 4, 32).amax(-1)
    assert (err <= step * 0.5 + step * 0.02 + 1e-6).all()


def test_int4_keeps_leading_dims_and_input_dtype() -> None:
    layer = Int4Linear.from_float(_weight(32, 64), 32)
    x = torch.randn(2, 3, 64)
    y = layer(x)
    assert y.shape == (2, 3, 32) and y.dtype == torch.float32


def test_int4_rejects_shapes_the_cpu_op_cannot_take() -> None:
    with pytest.raises(ValueError, match="divisible by 16"):
        Int4Linear.from_float(_weight(24, 64), 32)
    qweight, qzeros, scales = awq_quantize(_weight(32, 64), 32)
    with pytest.raises(ValueError, match="scales"):
        Int4Linear(qweight, qzeros, scales, 64)
    with pytest.raises(ValueError, match="input features 64"):
        Int4Linear(qweight, qzeros, scales, 32)(torch.randn(2, 63))


@pytest.mark.parametrize("cpu_mode", ["dequantized", "per_call"])
@pytest.mark.parametrize("m", [1, 32])
def test_fp8_matches_its_dense_twin(cpu_mode, m) -> None:
    w = _weight(960, 576)
    layer = Fp8Linear.from_float(w, cpu_mode=cpu_mode)
    x = torch.randn(m, 576).bfloat16()
    _close(layer(x), F.linear(x.float(), layer.dense_weight()).bfloat16(), 1e-2)
    w_fp8, scale = quantize_fp8_per_channel(w)
    torch.testing.assert_close(layer.dense_weight(), w_fp8.float() * scale[:, None], atol=1e-2, rtol=1e-2)
    expected_bytes = 960 * 576 * 2 + 960 * 4 if cpu_mode == "dequantized" else 960 * 576 + 960 * 4
    assert layer.weight_bytes == expected_bytes


def test_fp8_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        Fp8Linear(torch.randn(4, 4), torch.ones(4))
    w_fp8, scale = quantize_fp8_per_channel(torch.randn(4, 8))
    with pytest.raises(ValueError, match="cpu_mode"):
        Fp8Linear(w_fp8, scale, cpu_mode="lut")  # type: ignore[arg-type]


@pytest.mark.parametrize("m", [1, 32])
def test_int8_matches_its_dense_twin(m) -> None:
    w = _weight(576, 1536)
    layer = Int8Linear.from_float(w)
    x = torch.randn(m, 1536).bfloat16()
    _close(layer(x), F.linear(x.float(), layer.dense_weight()).bfloat16(), 1e-2)
    assert (layer.dense_weight() - w).abs().max() <= w.abs().amax() / 127
    assert layer.weight_bytes == 576 * 1536 + 576 * 2
