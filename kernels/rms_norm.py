"""RMSNorm with an optional fused residual add: one read of x (and residual), one write of each output."""

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
    fail,
    next_pow2,
)

_MAX_HIDDEN = 65536  # one row per program in registers; far above any model we serve


@triton.jit
def _rms_norm_kernel(
    out_ptr,  # [T, hidden] normed output, x's dtype
    residual_out_ptr,  # [T, hidden] x + residual (written only when HAS_RESIDUAL)
    x_ptr,  # [T, hidden] input rows, unit stride along hidden
    residual_ptr,  # [T, hidden] residual stream (read only when HAS_RESIDUAL)
    weight_ptr,  # [hidden] gain, x's dtype
    stride_out,  # row strides, in elements
    stride_residual_out,
    stride_x,
    stride_residual,
    hidden,  # row length
    eps,  # added to the mean square
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,  # next power of two >= hidden: the whole row is one tile
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        # Round the sum to the storage dtype before normalizing, as transformers does.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual); new_residual is x + residual, or x itself when residual is None."""
    op = "rms_norm"
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    tokens, hidden = x.shape
    check_tensor(op, "weight", weight, ndim=1, dtypes=FLOAT_DTYPES, contiguous=True)
    check_shape(op, "weight", weight, [hidden])
    check_same_dtype(op, x=x, weight=weight)
    if residual is not None:
        check_tensor(op, "residual", residual, ndim=2)
        check_shape(op, "residual", residual, [tokens, hidden])
        check_same_dtype(op, x=x, residual=residual)
    check_devices(op, [("x", x), ("weight", weight), ("residual", residual)])
    if hidden > _MAX_HIDDEN:
        fail(op, f"hidden size {hidden} exceeds the single-tile limit {_MAX_HIDDEN}")

    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(out) if residual is not None else x
    if tokens == 0:
        return out, residual_out
    block = next_pow2(hidden)
    _rms_norm_kernel[(tokens,)](
        out, residual_out, x, residual if residual is not None else x, weight,
        out.stride(0), residual_out.stride(0), x.stride(0),
        residual.stride(0) if residual is not None else 0,
        hidden, eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        # 4 warps up to 4096-wide rows, more beyond (Liger-Kernel's rule). Unmeasured on a GPU here.
        num_warps=min(16, max(4, block // 1024)),
    )
    return out, residual_out
