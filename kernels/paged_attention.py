"""Paged decode attention: one query token per sequence against its KV cache, read through block tables.

One program handles one (sequence, kv head, split): it loads every query head of that KV group
as the rows of one tile, so each K/V tile is read from memory once per group, not once per
head (GQA). Long contexts with few sequences are split across programs (flash-decoding) and
merged by a second kernel through the per-split log-sum-exp.
"""

from __future__ import annotations

import functools

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
    next_pow2,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_decode_attention_kernel(
    out_ptr,  # [S, H, D] output, or float32 [S, H, SPLITS, D] partial outputs when SPLITS > 1
    lse_ptr,  # float32 [S, H, SPLITS] log2-sum-exp of each split (written when SPLITS > 1)
    q_ptr,  # [S, H, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D] (FP8: uint8 [num_blocks, block_size, Hkv, D + 2])
    k_scale_ptr,  # FP8: float16 [num_blocks, block_size, Hkv] strided view of the key rows' scales
    v_scale_ptr,  # FP8: the value rows' scales
    block_tables_ptr,  # int32 [S, max_blocks_per_seq]
    context_lens_ptr,  # int32 [S]
    qk_scale,  # softmax scale times log2(e): the kernel works in base 2
    stride_q_s, stride_q_h,
    stride_k_b, stride_k_t, stride_k_h,
    stride_v_b, stride_v_t, stride_v_h,
    stride_ks_b, stride_ks_t, stride_ks_h,
    stride_vs_b, stride_vs_t, stride_vs_h,
    stride_bt_s,
    stride_o_s, stride_o_h, stride_o_split,
    stride_lse_s, stride_lse_h,
    head_dim,  # D
    GROUP: tl.constexpr,  # query heads per kv head
    KV_BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    SPLITS: tl.constexpr,  # programs sharing one sequence's context
    BLOCK_H: tl.constexpr,  # >= GROUP, >= 16 for tl.dot
    BLOCK_N: tl.constexpr,  # context tokens per iteration
    BLOCK_D: tl.constexpr,  # >= D
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,  # the cache is kernels/kv_fp8.py's layout: E4M3 bytes, a float16 scale per row
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    tokens_per_split = tl.cdiv(tl.cdiv(context_len, SPLITS), BLOCK_N) * BLOCK_N
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, context_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    head = kv_head * GROUP + offs_h
    mask_h = offs_h < GROUP
    mask_d = offs_d < head_dim
    q = tl.load(q_ptr + seq * stride_q_s + head[:, None] * stride_q_h + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
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
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
        if FP8:
            s = s * tl.trans(k_scale)
        s = tl.where(mask_n[None, :], s, float("-inf"))
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

    # An empty range (context shorter than this split's start) leaves l_i = 0: write zeros.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_offs = seq * stride_o_s + head[:, None] * stride_o_h + split * stride_o_split + offs_d[None, :]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])
    if SPLITS > 1:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + seq * stride_lse_s + head * stride_lse_h + split, lse, mask=mask_h)


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # [S, H, D] final output
    partial_ptr,  # float32 [S, H, SPLITS, D] contiguous
    lse_ptr,  # float32 [S, H, SPLITS] contiguous
    stride_o_s, stride_o_h,
    num_heads,  # H
    head_dim,  # D
    SPLITS: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,  # >= SPLITS
    BLOCK_D: tl.constexpr,  # >= D
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = seq * num_heads + head
    offs_s = tl.arange(0, BLOCK_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + row * SPLITS + offs_s, mask=offs_s < SPLITS, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    weight = tl.where(lse > float("-inf"), tl.exp2(lse - lse_max), 0.0)
    parts = tl.load(partial_ptr + (row * SPLITS + offs_s[:, None]) * head_dim + offs_d[None, :],
                    mask=(offs_s[:, None] < SPLITS) & (offs_d[None, :] < head_dim), other=0.0)
    total = tl.sum(weight, axis=0)
    out = tl.sum(parts * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_o_s + head * stride_o_h + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < head_dim)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _default_splits(num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Enough programs to fill the GPU, but no split shorter than 256 tokens.

    Unmeasured here (no GPU in development): the rule vLLM and FlashDecoding use, to be tuned
    with benchmarks/kernels/bench_paged_attention.py on the target GPU.
    """
    programs = num_seqs * num_kv_heads
    sms = _sm_count(device)
    if programs >= 2 * sms:
        return 1
    return max(1, min(16, -(-2 * sms // max(programs, 1)), max_context // 256))


def paged_decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q [S, H, D] against the cache → [S, H, D]; H must be a multiple of the cache's Hkv."""
    op = "paged_decode_attention"
    check_tensor(op, "q", q, ndim=3, dtypes=FLOAT_DTYPES)
    num_seqs, num_heads, head_dim = q.shape
    check_tensor(op, "key_cache", key_cache, ndim=4)
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    check_tensor(op, "value_cache", value_cache, ndim=4)
    fp8, k_scales, v_scales, scale_strides = check_caches(op, q, key_cache, value_cache)
    if num_heads % num_kv_heads:
        fail(op, f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    check_tensor(op, "block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES)
    check_shape(op, "block_tables", block_tables, [num_seqs, None])
    check_tensor(op, "context_lens", context_lens, ndim=1, dtypes=INDEX_DTYPES, contiguous=True)
    check_shape(op, "context_lens", context_lens, [num_seqs])
    check_devices(op, [("q", q), ("key_cache", key_cache), ("value_cache", value_cache),
                       ("block_tables", block_tables), ("context_lens", context_lens)])
    max_context = block_tables.shape[1] * block_size  # an upper bound that needs no device sync
    splits = num_splits or _default_splits(num_seqs, num_kv_heads, max_context, q.device)
    if splits < 1:
        fail(op, f"num_splits must be >= 1, got {splits}")

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_d = dot_block(head_dim)
    if splits > 1:
        target = torch.empty(num_seqs, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=q.device)
        strides = (*target.stride()[:3], lse.stride(0), lse.stride(1))
    else:
        target, lse = out, out  # lse is not touched with one split
        strides = (out.stride(0), out.stride(1), 0, 0, 0)
    _paged_decode_attention_kernel[(num_seqs, num_kv_heads, splits)](
        target, lse, q, key_cache, value_cache, k_scales, v_scales, block_tables, context_lens,
        scale * _LOG2E,
        q.stride(0), q.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        *scale_strides,
        block_tables.stride(0),
        *strides,
        head_dim,
        GROUP=group,
        KV_BLOCK_SIZE=block_size,
        SPLITS=splits,
        BLOCK_H=dot_block(group),
        # 64 tokens per step: four 16-token cache blocks, 8 KB of bf16 K at D=64. Unmeasured on a
        # GPU here; vLLM's Triton decode kernel uses the same tile.
        BLOCK_N=64,
        BLOCK_D=block_d,
        DOT_PRECISION=dot_precision(q.dtype),
        FP8=fp8,
        num_warps=4,
    )
    if splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            out, target, lse, out.stride(0), out.stride(1), num_heads, head_dim,
            SPLITS=splits, BLOCK_SPLITS=next_pow2(splits), BLOCK_D=next_pow2(head_dim), num_warps=1,
        )
    return out
