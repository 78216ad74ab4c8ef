"""Prefill attention over a paged cached prefix, for sequences of different lengths in one launch.

Queries are the new tokens of every sequence, flattened ([total_q, H, D], split by
cu_seqlens_q). Their K/V are already written into the paged cache behind each sequence's
cached prefix, so keys are always read through the block table: a chunked prefill, a prefix
cache hit and a plain prompt are the same case (prefix length 0 for the last).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._kv_operands import check_caches, fp8_bits_to_f16
from kernels._launch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_devices,
    check_shape,
    check_tensor,
    dot_block,
    dot_precision,
    fail,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _prefill_attention_kernel(
    out_ptr,  # [total_q, H, D]
    q_ptr,  # [total_q, H, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D] (FP8: uint8 [num_blocks, block_size, Hkv, D + 2])
    k_scale_ptr,  # FP8: float16 [num_blocks, block_size, Hkv] strided view of the key rows' scales
    v_scale_ptr,  # FP8: the value rows' scales
    block_tables_ptr,  # int32 [S, max_blocks_per_seq]
    cu_seqlens_q_ptr,  # int32 [S + 1] query offsets of each sequence
    context_lens_ptr,  # int32 [S] cached prefix + new tokens
    qk_scale,  # softmax scale times log2(e)
    stride_q_t, stride_q_h,
    stride_o_t, stride_o_h,
    stride_k_b, stride_k_t, stride_k_h,
    stride_v_b, stride_v_t, stride_v_h,
    stride_ks_b, stride_ks_t, stride_ks_h,
    stride_vs_b, stride_vs_t, stride_vs_h,
    stride_bt_s,
    head_dim,  # D
    GROUP: tl.constexpr,  # query heads per kv head
    KV_BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_M: tl.constexpr,  # query tokens per program
    BLOCK_N: tl.constexpr,  # keys per iteration
    BLOCK_D: tl.constexpr,  # >= D
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,  # the cache is kernels/kv_fp8.py's layout: E4M3 bytes, a float16 scale per row
):
    m_tile = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if m_tile * BLOCK_M >= q_len:  # the grid covers the longest sequence; shorter ones stop early
        return
    context_len = tl.load(context_lens_ptr + seq)
    prefix = context_len - q_len
    kv_head = head // GROUP

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < q_len
    mask_d = offs_d < head_dim
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_q_t + head * stride_q_h + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    query_pos = prefix + offs_m  # absolute position: query i sees keys 0..prefix+i

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum(context_len, prefix + (m_tile + 1) * BLOCK_M)  # causal bound of the tile's last row
    for tile in range(0, end, BLOCK_N):
        pos = tile + offs_n
        mask_n = pos < end
        block = tl.load(block_tables_ptr + seq * stride_bt_s + pos // KV_BLOCK_SIZE, mask=mask_n, other=0)
        slot = block.to(tl.int64)[:, None]
        in_block = (pos % KV_BLOCK_SIZE)[:, None]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k_offs = slot * stride_k_b + in_block * stride_k_t + kv_head * stride_k_h + offs_d[None, :]
        if FP8:  # exact values x 2^-8 in q's dtype; the row's scale (and the 2^8) goes on its scores
            k = fp8_bits_to_f16(tl.load(k_cache_ptr + k_offs, mask=kv_mask, other=0)).to(q.dtype)
            k_scale = tl.load(k_scale_ptr + slot * stride_ks_b + in_block * stride_ks_t + kv_head * stride_ks_h,
                              mask=mask_n[:, None], other=0.0).to(tl.float32) * 256.0
        else:
            k = tl.load(k_cache_ptr + k_offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if FP8:
            s = s * tl.trans(k_scale)
        # Every row keeps key 0, so no row is ever all -inf (padding rows included).
        s = tl.where((pos[None, :] <= query_pos[:, None]) & mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_offs = slot * stride_v_b + in_block * stride_v_t + kv_head * stride_v_h + offs_d[None, :]
        if FP8:  # the value rows' scales weigh the probabilities: sum_n p_n s_n v_n
            v = fp8_bits_to_f16(tl.load(v_cache_ptr + v_offs, mask=kv_mask, other=0)).to(q.dtype)
            v_scale = tl.load(v_scale_ptr + slot * stride_vs_b + in_block * stride_vs_t + kv_head * stride_vs_h,
                              mask=mask_n[:, None], other=0.0).to(tl.float32) * 256.0
            pv = p * tl.trans(v_scale)
        else:
            v = tl.load(v_cache_ptr + v_offs, mask=kv_mask, other=0.0)
            pv = p
        acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_o_t + head * stride_o_h + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def prefill_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """Causal attention of q [total_q, H, D] → [total_q, H, D].

    context_lens[s] counts sequence s's cached prefix plus its new tokens, whose K/V must
    already be in the cache. Pass max_seqlen_q when known to avoid a device sync.
    """
    op = "prefill_attention"
    check_tensor(op, "q", q, ndim=3, dtypes=FLOAT_DTYPES)
    _, num_heads, head_dim = q.shape
    check_tensor(op, "key_cache", key_cache, ndim=4)
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    check_tensor(op, "value_cache", value_cache, ndim=4)
    fp8, k_scales, v_scales, scale_strides = check_caches(op, q, key_cache, value_cache)
    if num_heads % num_kv_heads:
        fail(op, f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    check_tensor(op, "context_lens", context_lens, ndim=1, dtypes=INDEX_DTYPES, contiguous=True)
    num_seqs = context_lens.shape[0]
    check_tensor(op, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=INDEX_DTYPES, contiguous=True)
    check_shape(op, "cu_seqlens_q", cu_seqlens_q, [num_seqs + 1])
    check_tensor(op, "block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES)
    check_shape(op, "block_tables", block_tables, [num_seqs, None])
    check_devices(op, [("q", q), ("key_cache", key_cache), ("value_cache", value_cache),
                       ("block_tables", block_tables), ("cu_seqlens_q", cu_seqlens_q),
                       ("context_lens", context_lens)])
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if num_seqs else 0

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0 or max_seqlen_q == 0:
        return out
    # 64x64 tiles at D <= 128: FlashAttention-2's forward tile for head dims this small. Unmeasured
    # on a GPU here (none in development); tune with benchmarks/kernels/bench_prefill_attention.py.
    block_m = 64 if max_seqlen_q > 32 else dot_block(max_seqlen_q)
    grid = (triton.cdiv(max_seqlen_q, block_m), num_seqs, num_heads)
    _prefill_attention_kernel[grid](
        out, q, key_cache, value_cache, k_scales, v_scales, block_tables, cu_seqlens_q, context_lens,
        scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        *scale_strides,
        block_tables.stride(0),
        head_dim,
        GROUP=num_heads // num_kv_heads,
        KV_BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_D=dot_block(head_dim),
        DOT_PRECISION=dot_precision(q.dtype),
        FP8=fp8,
        num_warps=4,
    )
    return out
