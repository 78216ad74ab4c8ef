"""RMSNorm (with and without the fused residual), rotary embedding and SiLU-and-mul kernels."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import rms_norm_ref, rotary_embedding_ref, silu_and_mul_ref
from kernels.rms_norm import rms_norm
from kernels.rotary import rotary_embedding
from kernels.silu_and_mul import silu_and_mul
from tests.kernels.helpers import DTYPES, assert_close


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 576), (5, 577), (3, 100)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, tokens, hidden, with_residual) -> None:
    x = torch.randn(tokens, hidden).to(dtype)
    weight = torch.randn(hidden).to(dtype)
    residual = torch.randn(tokens, hidden).to(dtype) if with_residual else None
    normed, new_residual = rms_norm(x, weight, 1e-5, residual)
    ref_normed, ref_residual = rms_norm_ref(x, weight, 1e-5, residual)
    # Same rounding points as the reference (and transformers); only the sum order differs.
    assert_close(normed, ref_normed)
    assert torch.equal(new_residual, ref_residual)  # one rounded add: exact
    if residual is None:
        assert new_residual is x


def test_rms_norm_on_strided_rows() -> None:
    wide = torch.randn(4, 300)
    x, residual = wide[:, :200], wide[:, 100:]  # row stride 300, unit column stride
    normed, new_residual = rms_norm(x, torch.ones(200), 1e-6, residual)
    ref_normed, ref_residual = rms_norm_ref(x, torch.ones(200), 1e-6, residual)
    assert_close(normed, ref_normed)
    assert_close(new_residual, ref_residual)


def _tables(max_pos: int, half: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(half).float() / half))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 40)])
def test_rotary_on_views_of_a_fused_qkv(dtype, heads, kv_heads, head_dim) -> None:
    tokens = 7
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.tensor([0, 1, 2, 50, 99, 3, 7])
    cos, sin = _tables(100, head_dim // 2, torch.float32)
    got_q, got_k = rotary_embedding(q, k, positions, cos, sin)
    exp_q, exp_k = rotary_embedding_ref(q, k, positions, cos, sin)
    assert_close(got_q, exp_q)
    assert_close(got_k, exp_k)


def test_rotary_with_int32_positions_and_model_dtype_tables() -> None:
    q, k = torch.randn(3, 2, 16).bfloat16(), torch.randn(3, 1, 16).bfloat16()
    cos, sin = _tables(10, 8, torch.bfloat16)
    positions = torch.tensor([9, 0, 4], dtype=torch.int32)
    for got, expected in zip(rotary_embedding(q, k, positions, cos, sin),
                             rotary_embedding_ref(q, k, positions, cos, sin), strict=True):
        assert_close(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,intermediate", [(1, 1536), (3, 1537), (4, 17)])
def test_silu_and_mul(dtype, tokens, intermediate) -> None:
    x = torch.randn(tokens, 2 * intermediate).to(dtype)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


def test_silu_and_mul_on_strided_rows() -> None:
    x = torch.randn(3, 80)[:, :66]
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))
