"""The torch references against straightforward dense computations, so the definition is right."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import reference as R
from kernels.awq_layout import awq_dequantize, awq_quantize
from tests.kernels.helpers import paged_cache


def _contiguous_kv(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """[n, Hkv, D] read block by block with plain indexing, independent of gather_kv."""
    bs = cache.shape[1]
    return torch.stack([cache[int(table[i // bs]), i % bs] for i in range(n)])


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
def test_paged_decode_ref_matches_sdpa_on_contiguous_kv(heads: int, kv_heads: int) -> None:
    lens = [1, 16, 17, 40]
    kc, vc, tables = paged_cache(16, 16, kv_heads, 32, torch.float32, lens)
    q = torch.randn(len(lens), heads, 32)
    out = R.paged_decode_attention_ref(q, kc, vc, tables, torch.tensor(lens, dtype=torch.int32), 0.2)
    for s, n in enumerate(lens):
        k = _contiguous_kv(kc, tables[s], n).transpose(0, 1)[None]
        v = _contiguous_kv(vc, tables[s], n).transpose(0, 1)[None]
        expected = F.scaled_dot_product_attention(q[s][None, :, None], k, v, scale=0.2, enable_gqa=True)
        torch.testing.assert_close(out[s], expected[0, :, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
def test_prefill_ref_matches_sdpa_with_prefix_mask(heads: int, kv_heads: int) -> None:
    q_lens, lens = [5, 1, 20], [5, 18, 33]  # no prefix, one new token on a prefix, chunk on a prefix
    kc, vc, tables = paged_cache(16, 16, kv_heads, 32, torch.float32, lens, seed=1)
    cu = torch.tensor([0, 5, 6, 26], dtype=torch.int32)
    q = torch.randn(26, heads, 32)
    out = R.prefill_attention_ref(q, kc, vc, tables, cu, torch.tensor(lens, dtype=torch.int32), 0.2)
    for s, (q_len, n) in enumerate(zip(q_lens, lens, strict=True)):
        k = _contiguous_kv(kc, tables[s], n).transpose(0, 1)[None]
        v = _contiguous_kv(vc, tables[s], n).transpose(0, 1)[None]
        qs = q[int(cu[s]) : int(cu[s + 1])].transpose(0, 1)[None]
        mask = torch.ones(q_len, n, dtype=torch.bool).tril(n - q_len)
        expected = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=0.2, enable_gqa=True)
        torch.testing.assert_close(out[int(cu[s]) : int(cu[s + 1])], expected[0].transpose(0, 1),
                                   atol=1e-5, rtol=1e-5)
        if q_len == n:
            causal = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=0.2, enable_gqa=True)
            torch.testing.assert_close(expected, causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_ref_matches_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(96).to(dtype)
    x, residual = torch.randn(7, 96).to(dtype), torch.randn(7, 96).to(dtype)
    normed, new_residual = R.rms_norm_ref(x, norm.weight.data, 1e-5, residual)
    assert torch.equal(new_residual, residual + x)
    assert torch.equal(normed, norm(residual + x).detach())
    plain, same = R.rms_norm_ref(x, norm.weight.data, 1e-5)
    assert same is x and torch.equal(plain, norm(x).detach())


def test_rotary_ref_matches_transformers() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    freqs = torch.outer(torch.arange(50).float(), inv_freq)
    positions = torch.tensor([0, 3, 49, 7])
    q, k = torch.randn(4, 6, 32), torch.randn(4, 2, 32)
    got_q, got_k = R.rotary_embedding_ref(q, k, positions, freqs.cos(), freqs.sin())
    emb = torch.cat([freqs, freqs], dim=-1)[positions]  # HF's [T, D] tables
    exp_q, exp_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                        emb.cos()[None], emb.sin()[None])
    torch.testing.assert_close(got_q, exp_q[0].transpose(0, 1))
    torch.testing.assert_close(got_k, exp_k[0].transpose(0, 1))


def test_silu_and_mul_ref_matches_split_formula() -> None:
    x = torch.randn(5, 2 * 33)
    torch.testing.assert_close(R.silu_and_mul_ref(x), F.silu(x[:, :33]) * x[:, 33:])


def test_lora_refs_match_a_per_token_loop() -> None:
    torch.manual_seed(0)
    tokens, k_in, rank, n_out, slots = 9, 24, 4, 10, 3
    x = torch.randn(tokens, k_in)
    lora_a, lora_b = torch.randn(slots, rank, k_in), torch.randn(slots, n_out, rank)
    scaling = torch.tensor([0.5, 2.0, 1.0])
    seg_indptr = torch.tensor([0, 2, 3, 7, 9], dtype=torch.int32)
    seg_ids = torch.tensor([2, -1, 0, 2], dtype=torch.int32)
    token_ids = R.segments_to_token_ids(seg_indptr, seg_ids, tokens)
    assert token_ids.tolist() == [2, 2, -1, 0, 0, 0, 0, 2, 2]
    y = torch.randn(tokens, n_out + 5)
    expected = y.clone()
    for t, slot in enumerate(token_ids.tolist()):
        if slot >= 0:
            expected[t, 5:] += scaling[slot] * (lora_b[slot] @ (lora_a[slot] @ x[t]))
    buf = R.sgmv_shrink_ref(x, lora_a, scaling, seg_indptr, seg_ids)
    assert torch.equal(buf[2], torch.zeros(rank))
    torch.testing.assert_close(R.sgmv_expand_ref(y.clone(), buf, lora_b, seg_indptr, seg_ids, 5), expected)
    buf = R.bgmv_shrink_ref(x, lora_a, scaling, token_ids)
    torch.testing.assert_close(R.bgmv_expand_ref(y.clone(), buf, lora_b, token_ids, 5), expected)


def test_fp8_refs_match_dequantized_dense() -> None:
    w, x = torch.randn(48, 64), torch.randn(5, 64)
    w_fp8, scale = R.quantize_fp8_per_channel(w)
    dense = w_fp8.float() * scale[:, None]
    assert (dense - w).abs().max() <= 0.07 * w.abs().amax()  # 3 mantissa bits: <= 1/16 relative
    torch.testing.assert_close(R.fp8_linear_ref(x, w_fp8, scale), x @ dense.t())
    x_fp8, x_scale = R.quantize_fp8_per_token(x)
    torch.testing.assert_close(R.fp8_w8a8_linear_ref(x, w_fp8, scale), (x_fp8.float() * x_scale) @ dense.t())


def test_awq_ref_matches_elementwise_dequantization() -> None:
    w, x = torch.randn(16, 256), torch.randn(3, 256)
    qweight, qzeros, scales = awq_quantize(w, group_size=128)
    dense = awq_dequantize(qweight, qzeros, scales, 128)  # [K, N]
    assert (dense.t() - w).abs().max() <= 0.5 * scales.float().max() + 1e-6  # RTN: half a step
    torch.testing.assert_close(R.awq_gemm_ref(x, qweight, qzeros, scales, 128), x @ dense)
