"""FP8 (e4m3) linear layers: a weight-only Triton GEMM and a W8A8 path through torch._scaled_mm.

Weight-only: y = x (w · scale[:, None])^T with w e4m3 [N, K] and one float32 scale per output
channel; x stays bf16/fp16/fp32. The kernel decodes e4m3 with integer ops instead of the
hardware conversion, so it runs on every GPU Triton supports, Ampere included (whose fp8
conversions Triton rejects): e4m3's sign, exponent and mantissa shifted into an fp16 bit
pattern give exactly value / 2^8 (normals and subnormals alike, the exponent biases 7 and 15
differ by 8), and the 2^8 folds into the per-channel scale.

W8A8: activations quantized per token to e4m3 and both operands fed to the FP8 tensor cores
through torch._scaled_mm with row-wise scales; only on CUDA devices of capability >= 8.9.
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
from kernels.reference import quantize_fp8_per_token

_E4M3_TO_FP16_EXPONENT_SHIFT = 256.0  # 2^(15 - 7)


@triton.jit
def _fp8_linear_kernel(
    y_ptr,  # [M, N] x's dtype
    x_ptr,  # [M, K]
    w_ptr,  # uint8 [N, K]: the e4m3 weight's bytes
    scale_ptr,  # float32 [N] per-output-channel scale, pre-multiplied by 2^8
    M, N, K,
    stride_x_m, stride_w_n, stride_y_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row tiles that share column tiles while they are in L2
    DOT_PRECISION: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_x_m + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        bits = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_w_n + offs_k[:, None],
                       mask=mask_k[:, None] & mask_n[None, :], other=0).to(tl.int32)  # [BLOCK_K, BLOCK_N]
        half_bits = ((bits & 0x80) << 8) | ((bits & 0x7F) << 7)
        w = half_bits.to(tl.uint16).to(tl.float16, bitcast=True)  # exactly e4m3 value / 2^8
        acc += tl.dot(x, w.to(x.dtype), input_precision=DOT_PRECISION)
    scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
    acc = acc * scale[None, :]
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y_m + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _check_fp8_args(op: str, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(op, "weight", weight, ndim=2, dtypes=(torch.float8_e4m3fn,))
    check_shape(op, "weight", weight, [None, x.shape[1]])
    check_tensor(op, "weight_scale", weight_scale, ndim=1, dtypes=(torch.float32,), contiguous=True)
    check_shape(op, "weight_scale", weight_scale, [weight.shape[0]])


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Weight-only FP8: x [M, K] @ (weight [N, K] e4m3 · weight_scale [N])^T → [M, N] in x's dtype."""
    op = "fp8_linear"
    _check_fp8_args(op, x, weight, weight_scale)
    check_devices(op, [("x", x), ("weight", weight), ("weight_scale", weight_scale)])
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    # Tiles from Triton's matmul tutorial, with BLOCK_M shrunk to the batch so decode (M = 1)
    # does not compute 63 padding rows. Unmeasured on a GPU here (none in development).
    block_m, block_n, block_k = dot_block(m, cap=64), 64, 64
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_linear_kernel[grid](
        y, x, weight.view(torch.uint8), weight_scale * _E4M3_TO_FP16_EXPONENT_SHIFT,
        m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
        DOT_PRECISION=dot_precision(x.dtype), num_warps=4,
    )
    return y


def w8a8_supported(device: torch.device | str) -> bool:
    """FP8 tensor cores (Ada, Hopper and later) and a torch that exposes them."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_w8a8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """W8A8 FP8: per-token e4m3 activations × per-channel e4m3 weights → [M, N] in x's dtype.

    Raises ValueError on a CUDA device without FP8 tensor cores; kernels.dispatch.fp8_linear
    falls back to the weight-only kernel there. torch's CPU build also implements
    _scaled_mm, which lets the tests exercise this path without a GPU.
    """
    op = "fp8_w8a8_linear"
    _check_fp8_args(op, x, weight, weight_scale)
    if x.device.type == "cuda":
        if not w8a8_supported(x.device):
            fail(op, f"{x.device} has no FP8 tensor cores (needs compute capability >= 8.9); "
                     "use the weight-only fp8_linear instead")
        if x.shape[1] % 16 or weight.shape[0] % 16:
            fail(op, f"torch._scaled_mm needs K and N divisible by 16, got K={x.shape[1]} N={weight.shape[0]}")
    x_fp8, x_scale = quantize_fp8_per_token(x)
    return torch._scaled_mm(
        x_fp8, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), out_dtype=x.dtype
    )
