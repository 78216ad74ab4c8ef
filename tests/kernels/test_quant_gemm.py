"""FP8 weight-only and W8A8 GEMMs, and the AWQ W4A16 GEMM, against their references."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as R
from kernels.awq_gemm import awq_gemm
from kernels.awq_layout import awq_quantize
from kernels.fp8_gemm import fp8_linear, fp8_w8a8_linear, w8a8_supported
from tests.kernels.helpers import DTYPES, assert_close_to_scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 200, 70), (33, 64, 130)])
def test_fp8_weight_only(dtype, m, k, n) -> None:
    weight, scale = R.quantize_fp8_per_channel(torch.randn(n, k))
    x = torch.randn(m, k).to(dtype)
    assert_close_to_scale(fp8_linear(x, weight, scale), R.fp8_linear_ref(x, weight, scale))


def test_fp8_decodes_every_e4m3_value_exactly() -> None:
    # All 254 finite codes, subnormals and negative zero included, through the integer decoder.
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = codes[~codes.float().isnan()]
    weight = codes[:, None].repeat(1, 16).contiguous()  # [254, 16]
    x = torch.zeros(1, 16)
    x[0, 0] = 1.0
    got = fp8_linear(x, weight, torch.ones(weight.shape[0]))
    assert torch.equal(got[0], codes.float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_w8a8_through_scaled_mm(dtype) -> None:
    # torch's CPU build implements _scaled_mm, so the W8A8 path runs here too; dispatch uses it on GPUs only.
    weight, scale = R.quantize_fp8_per_channel(torch.randn(48, 64))
    x = torch.randn(5, 64).to(dtype)
    assert_close_to_scale(fp8_w8a8_linear(x, weight, scale), R.fp8_w8a8_linear_ref(x, weight, scale))
    assert not w8a8_supported("cpu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,group", [(1, 256, 72, 128), (33, 384, 200, 128), (5, 192, 64, 64)])
def test_awq_gemm(dtype, m, k, n, group) -> None:
    qweight, qzeros, scales = awq_quantize(torch.randn(n, k), group)
    x = torch.randn(m, k).to(dtype)
    expected = R.awq_gemm_ref(x, qweight, qzeros, scales, group)
    assert_close_to_scale(awq_gemm(x, qweight, qzeros, scales, group), expected)


def test_awq_gemm_with_bf16_scales_and_strided_input() -> None:
    qweight, qzeros, scales = awq_quantize(torch.randn(16, 256), 128)
    x = torch.randn(3, 300)[:, :256]
    got = awq_gemm(x, qweight, qzeros, scales.bfloat16(), 128)
    assert_close_to_scale(got, R.awq_gemm_ref(x, qweight, qzeros, scales.bfloat16(), 128))
