"""AWQ W4A16 GEMM: x [M, K] @ dequant(qweight, qzeros, scales) → [M, N], weights in AutoAWQ's GEMM layout.

The packed int32 words are read as they sit in the checkpoint (see kernels/awq_layout.py for
the nibble order) and dequantized in registers, one K tile at a time: memory traffic is the
4-bit weight plus one scale and zero row per group, which is what makes W4A16 pay at decode.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_devices,
    check_shape,
    check_tensor,
    dot_block,
    dot_precision,
    fail,
)
from kernels._tiles import grouped_tile


@triton.jit
def _awq_gemm_kernel(
    y_ptr,  # [M, N] x's dtype
    x_ptr,  # [M, K]
    qweight_ptr,  # int32 [K, N / 8]
    qzeros_ptr,  # int32 [K / GROUP_SIZE, N / 8]
    scales_ptr,  # [K / GROUP_SIZE, N] fp16/bf16/fp32
    M, N, K,
    stride_x_m, stride_qw_k, stride_qz_g, stride_s_g, stride_y_m,
    GROUP_SIZE: tl.constexpr,  # input rows sharing one scale and zero point
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # divides GROUP_SIZE, so one tile sits in one group
    GROUP_M: tl.constexpr,  # row tiles that share column tiles while they are in L2
    DOT_PRECISION: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    word = offs_n // 8
    # Column c of a word sits in nibble AWQ_REVERSE_ORDER[c % 8] = (c % 8) // 2 + 4 (c % 2).
    shifts = ((offs_n % 8) // 2 + (offs_n % 2) * 4) * 4
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_x_m + offs_k[None, :],
                    mask=mask_m[:, None], other=0.0)
        # Eight neighbouring columns read the same word: one transaction, shifted eight ways.
        packed = tl.load(qweight_ptr + offs_k[:, None].to(tl.int64) * stride_qw_k + word[None, :],
                         mask=mask_n[None, :], other=0)
        q = (packed >> shifts[None, :]) & 0xF
        group = k0 // GROUP_SIZE
        z = (tl.load(qzeros_ptr + group * stride_qz_g + word, mask=mask_n, other=0) >> shifts) & 0xF
        s = tl.load(scales_ptr + group * stride_s_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        w = ((q - z[None, :]).to(tl.float32) * s[None, :]).to(x.dtype)
        acc += tl.dot(x, w, input_precision=DOT_PRECISION)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y_m + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def awq_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int = 128,
) -> torch.Tensor:
    """x [M, K] @ AWQ weight → [M, N] in x's dtype; K a multiple of group_size, N of 8."""
    op = "awq_gemm"
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    m, k = x.shape
    if group_size < 16 or group_size & (group_size - 1):
        fail(op, f"group_size must be a power of two >= 16, got {group_size}")
    if k % group_size:
        fail(op, f"in_features {k} must be a multiple of group_size {group_size}")
    check_tensor(op, "qweight", qweight, ndim=2, dtypes=(torch.int32,))
    check_shape(op, "qweight", qweight, [k, None])
    n = qweight.shape[1] * 8
    check_tensor(op, "qzeros", qzeros, ndim=2, dtypes=(torch.int32,))
    check_shape(op, "qzeros", qzeros, [k // group_size, n // 8])
    check_tensor(op, "scales", scales, ndim=2, dtypes=FLOAT_DTYPES)
    check_shape(op, "scales", scales, [k // group_size, n])
    check_devices(op, [("x", x), ("qweight", qweight), ("qzeros", qzeros), ("scales", scales)])

    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    # As fp8_linear: tutorial tiles, BLOCK_M shrunk to the batch. Unmeasured on a GPU here.
    block_m, block_n, block_k = dot_block(m, cap=64), 64, min(64, group_size)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _awq_gemm_kernel[grid](
        y, x, qweight, qzeros, scales, m, n, k,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), y.stride(0),
        GROUP_SIZE=group_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
        DOT_PRECISION=dot_precision(x.dtype), num_warps=4,
    )
    return y
