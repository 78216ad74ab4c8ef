"""LoRA expand for a batch that mixes adapters: y[:, off:off+out] += buf B[slot]^T, in place.

buf is the float32 [T, rank] that shrink produced (scaling already applied); lora_b is
[num_slots, out, rank]. col_offset picks the slice of a fused output (q, k or v of a qkv
projection) that this adapter weight targets. SGMV for segments (prefill), BGMV per token
(decode), as in lora_shrink; id -1 leaves the row untouched.
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
    fail,
)
from kernels._lora_checks import check_segments, check_token_ids, max_segment_length


@triton.jit
def _sgmv_expand_kernel(
    y_ptr,  # [T, total_out] updated in place
    buf_ptr,  # float32 [T, rank]
    lora_b_ptr,  # [num_slots, out, rank]
    seg_indptr_ptr,  # int32 [num_segments + 1]
    seg_lora_ids_ptr,  # int32 [num_segments], -1 for none
    stride_y_t, stride_buf_t, stride_b_s, stride_b_n,
    col_offset,  # first column of y this weight writes
    out_features, rank,
    BLOCK_M: tl.constexpr,  # tokens per program
    BLOCK_N: tl.constexpr,  # output columns per program
    BLOCK_R: tl.constexpr,  # >= rank, >= 16
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 weights (TF32 erred ~8e-3 on an H100), else "tf32"
):
    m_tile = tl.program_id(0)
    n_tile = tl.program_id(1)
    segment = tl.program_id(2)
    slot = tl.load(seg_lora_ids_ptr + segment).to(tl.int64)
    start = tl.load(seg_indptr_ptr + segment)
    seg_len = tl.load(seg_indptr_ptr + segment + 1) - start
    if (slot < 0) | (m_tile * BLOCK_M >= seg_len):
        return
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    mask_m = offs_m < seg_len
    mask_n = offs_n < out_features
    mask_r = offs_r < rank
    rows = (start + offs_m).to(tl.int64)
    b_t = tl.load(lora_b_ptr + slot * stride_b_s + offs_n[None, :] * stride_b_n + offs_r[:, None],
                  mask=mask_r[:, None] & mask_n[None, :], other=0.0)  # [BLOCK_R, BLOCK_N]
    buf = tl.load(buf_ptr + rows[:, None] * stride_buf_t + offs_r[None, :],
                  mask=mask_m[:, None] & mask_r[None, :], other=0.0)
    # Rank-sized activations go to the weight dtype so the dot runs on tensor cores, as in Punica.
    delta = tl.dot(buf.to(b_t.dtype), b_t, input_precision=DOT_PRECISION)
    y_ptrs = y_ptr + rows[:, None] * stride_y_t + col_offset + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bgmv_expand_kernel(
    y_ptr,  # [T, total_out] updated in place
    buf_ptr,  # float32 [T, rank]
    lora_b_ptr,  # [num_slots, out, rank]
    token_lora_ids_ptr,  # int32 [T], -1 for none
    stride_y_t, stride_buf_t, stride_b_s, stride_b_n,
    col_offset, out_features, rank,
    BLOCK_N: tl.constexpr,  # output columns per program
    BLOCK_R: tl.constexpr,  # >= rank
):
    token = tl.program_id(0).to(tl.int64)
    n_tile = tl.program_id(1)
    slot = tl.load(token_lora_ids_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    mask_n = offs_n < out_features
    mask_r = offs_r < rank
    buf = tl.load(buf_ptr + token * stride_buf_t + offs_r, mask=mask_r, other=0.0)
    b = tl.load(lora_b_ptr + slot * stride_b_s + offs_n[:, None] * stride_b_n + offs_r[None, :],
                mask=mask_n[:, None] & mask_r[None, :], other=0.0).to(tl.float32)
    delta = tl.sum(b * buf[None, :], axis=1)
    y_ptrs = y_ptr + token * stride_y_t + col_offset + offs_n
    y = tl.load(y_ptrs, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=mask_n)


def _check_common(op: str, y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor, col_offset: int) -> None:
    check_tensor(op, "y", y, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(op, "buf", buf, ndim=2, dtypes=(torch.float32,))
    check_tensor(op, "lora_b", lora_b, ndim=3)
    check_shape(op, "lora_b", lora_b, [None, None, buf.shape[1]])
    check_shape(op, "buf", buf, [y.shape[0], None])
    check_same_dtype(op, y=y, lora_b=lora_b)
    if col_offset < 0 or col_offset + lora_b.shape[1] > y.shape[1]:
        fail(op, f"columns [{col_offset}, {col_offset + lora_b.shape[1]}) fall outside y's {y.shape[1]} columns")


def sgmv_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    seg_indptr: torch.Tensor,
    seg_lora_ids: torch.Tensor,
    col_offset: int = 0,
    *,
    max_seg_len: int | None = None,
) -> torch.Tensor:
    """Adds each segment's buf B^T into y's columns [col_offset, col_offset + out); returns y."""
    op = "sgmv_expand"
    _check_common(op, y, buf, lora_b, col_offset)
    num_segments = check_segments(op, seg_indptr, seg_lora_ids)
    check_devices(op, [("y", y), ("buf", buf), ("lora_b", lora_b), ("seg_indptr", seg_indptr),
                       ("seg_lora_ids", seg_lora_ids)])
    longest = max_segment_length(seg_indptr, max_seg_len)
    if num_segments == 0 or longest == 0:
        return y
    out_features, rank = lora_b.shape[1], lora_b.shape[2]
    block_m, block_n = dot_block(longest, cap=64), 64
    grid = (triton.cdiv(longest, block_m), triton.cdiv(out_features, block_n), num_segments)
    _sgmv_expand_kernel[grid](
        y, buf, lora_b, seg_indptr, seg_lora_ids,
        y.stride(0), buf.stride(0), lora_b.stride(0), lora_b.stride(1),
        col_offset, out_features, rank,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=dot_block(rank), DOT_PRECISION=dot_precision(lora_b.dtype),
        num_warps=4,
    )
    return y


def bgmv_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    token_lora_ids: torch.Tensor,
    col_offset: int = 0,
) -> torch.Tensor:
    """Adds each token's buf B^T into y's columns [col_offset, col_offset + out); returns y."""
    op = "bgmv_expand"
    _check_common(op, y, buf, lora_b, col_offset)
    check_token_ids(op, token_lora_ids, y.shape[0])
    check_devices(op, [("y", y), ("buf", buf), ("lora_b", lora_b), ("token_lora_ids", token_lora_ids)])
    if y.shape[0] == 0:
        return y
    out_features, rank = lora_b.shape[1], lora_b.shape[2]
    block_n = 128
    _bgmv_expand_kernel[(y.shape[0], triton.cdiv(out_features, block_n))](
        y, buf, lora_b, token_lora_ids,
        y.stride(0), buf.stride(0), lora_b.stride(0), lora_b.stride(1),
        col_offset, out_features, rank,
        BLOCK_N=block_n, BLOCK_R=max(2, triton.next_power_of_2(rank)), num_warps=4,
    )
    return y
