"""LoRA shrink for a batch that mixes adapters: buf = scaling[slot] · x A[slot]^T, float32 [T, rank].

Two launch shapes over the same stacked weights (lora_a [num_slots, rank, in]):

- SGMV (prefill): tokens come in contiguous segments, one adapter each; a program computes a
  [BLOCK_M, rank] tile of one segment with tensor-core dots.
- BGMV (decode): one adapter id per token; a program computes one token's row as a
  matrix-vector product (a dot needs 16 rows, and decode has one per adapter at best).

Adapter id -1 means "no adapter": those rows stay zero and expand skips them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_devices,
    check_same_dtype,
    check_shape,
    check_tensor,
    dot_block,
    dot_precision,
    next_pow2,
)
from kernels._lora_checks import check_scaling, check_segments, check_token_ids, max_segment_length


@triton.jit
def _sgmv_shrink_kernel(
    out_ptr,  # float32 [T, rank], zero-initialized
    x_ptr,  # [T, in]
    lora_a_ptr,  # [num_slots, rank, in]
    scaling_ptr,  # float32 [num_slots]
    seg_indptr_ptr,  # int32 [num_segments + 1] token offsets of the segments
    seg_lora_ids_ptr,  # int32 [num_segments] adapter slot per segment, -1 for none
    stride_x_t, stride_a_s, stride_a_r, stride_o_t,
    in_features, rank,
    BLOCK_M: tl.constexpr,  # tokens per program
    BLOCK_R: tl.constexpr,  # >= rank, >= 16
    BLOCK_K: tl.constexpr,  # input features per iteration
    DOT_PRECISION: tl.constexpr,
):
    m_tile = tl.program_id(0)
    segment = tl.program_id(1)
    slot = tl.load(seg_lora_ids_ptr + segment).to(tl.int64)
    start = tl.load(seg_indptr_ptr + segment)
    seg_len = tl.load(seg_indptr_ptr + segment + 1) - start
    if (slot < 0) | (m_tile * BLOCK_M >= seg_len):
        return
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    mask_m = offs_m < seg_len
    mask_r = offs_r < rank
    rows = (start + offs_m).to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < in_features
        x = tl.load(x_ptr + rows[:, None] * stride_x_t + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        a_t = tl.load(lora_a_ptr + slot * stride_a_s + offs_r[None, :] * stride_a_r + offs_k[:, None],
                      mask=mask_k[:, None] & mask_r[None, :], other=0.0)  # [BLOCK_K, BLOCK_R]
        acc += tl.dot(x, a_t, input_precision=DOT_PRECISION)
    acc *= tl.load(scaling_ptr + slot)
    tl.store(out_ptr + rows[:, None] * stride_o_t + offs_r[None, :], acc, mask=mask_m[:, None] & mask_r[None, :])


@triton.jit
def _bgmv_shrink_kernel(
    out_ptr,  # float32 [T, rank], zero-initialized
    x_ptr,  # [T, in]
    lora_a_ptr,  # [num_slots, rank, in]
    scaling_ptr,  # float32 [num_slots]
    token_lora_ids_ptr,  # int32 [T] adapter slot per token, -1 for none
    stride_x_t, stride_a_s, stride_a_r, stride_o_t,
    in_features, rank,
    BLOCK_R: tl.constexpr,  # >= rank
    BLOCK_K: tl.constexpr,  # input features per iteration
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(token_lora_ids_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < rank
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < in_features
        x = tl.load(x_ptr + token * stride_x_t + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        a = tl.load(lora_a_ptr + slot * stride_a_s + offs_r[:, None] * stride_a_r + offs_k[None, :],
                    mask=mask_r[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    acc *= tl.load(scaling_ptr + slot)
    tl.store(out_ptr + token * stride_o_t + offs_r, acc, mask=mask_r)


def _check_common(op: str, x: torch.Tensor, lora_a: torch.Tensor, scaling: torch.Tensor) -> None:
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(op, "lora_a", lora_a, ndim=3)
    check_shape(op, "lora_a", lora_a, [None, None, x.shape[1]])
    check_same_dtype(op, x=x, lora_a=lora_a)
    check_scaling(op, scaling, lora_a.shape[0])


def sgmv_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    scaling: torch.Tensor,
    seg_indptr: torch.Tensor,
    seg_lora_ids: torch.Tensor,
    *,
    max_seg_len: int | None = None,
) -> torch.Tensor:
    """x [T, in] → float32 [T, rank]; pass max_seg_len when known to avoid a device sync."""
    op = "sgmv_shrink"
    _check_common(op, x, lora_a, scaling)
    num_segments = check_segments(op, seg_indptr, seg_lora_ids)
    check_devices(op, [("x", x), ("lora_a", lora_a), ("scaling", scaling), ("seg_indptr", seg_indptr),
                       ("seg_lora_ids", seg_lora_ids)])
    rank = lora_a.shape[1]
    out = torch.zeros(x.shape[0], rank, dtype=torch.float32, device=x.device)
    longest = max_segment_length(seg_indptr, max_seg_len)
    if num_segments == 0 or longest == 0:
        return out
    block_m = dot_block(longest, cap=64)
    _sgmv_shrink_kernel[(triton.cdiv(longest, block_m), num_segments)](
        out, x, lora_a, scaling, seg_indptr, seg_lora_ids,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0),
        x.shape[1], rank,
        BLOCK_M=block_m, BLOCK_R=dot_block(rank), BLOCK_K=64,
        DOT_PRECISION=dot_precision(x.dtype), num_warps=4,
    )
    return out


def bgmv_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, scaling: torch.Tensor, token_lora_ids: torch.Tensor
) -> torch.Tensor:
    """x [T, in] → float32 [T, rank], one adapter id per token."""
    op = "bgmv_shrink"
    _check_common(op, x, lora_a, scaling)
    check_token_ids(op, token_lora_ids, x.shape[0])
    check_devices(op, [("x", x), ("lora_a", lora_a), ("scaling", scaling), ("token_lora_ids", token_lora_ids)])
    rank = lora_a.shape[1]
    out = torch.zeros(x.shape[0], rank, dtype=torch.float32, device=x.device)
    if x.shape[0] == 0:
        return out
    block_r = next_pow2(rank)
    _bgmv_shrink_kernel[(x.shape[0],)](
        out, x, lora_a, scaling, token_lora_ids,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0),
        x.shape[1], rank,
        # Keep the [rank, BLOCK_K] weight tile near 4K elements, whatever the rank.
        BLOCK_R=block_r, BLOCK_K=max(32, min(256, 4096 // block_r)), num_warps=4,
    )
    return out
