"""Rotary position embedding, NeoX / Hugging Face ``rotate_half`` style, on q and k in one launch."""

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


@triton.jit
def _rotate_heads(
    out_ptr, x_ptr, stride_out_t, stride_out_h, stride_x_t, stride_x_h, token, heads, half, cos, sin,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """Rotates `heads` heads of one token; cos/sin are [BLOCK_HALF] float32."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < heads) & (offs_d[None, :] < half)
    src = x_ptr + token * stride_x_t + offs_h[:, None] * stride_x_h + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + token * stride_out_t + offs_h[:, None] * stride_out_h + offs_d[None, :]
    dtype = out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype), mask=mask)
    tl.store(dst + half, (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype), mask=mask)


@triton.jit
def _rotary_embedding_kernel(
    q_out_ptr,  # [T, H, D] rotated q
    k_out_ptr,  # [T, Hkv, D] rotated k
    q_ptr,  # [T, H, D] may be a strided view into a fused qkv output
    k_ptr,  # [T, Hkv, D] likewise
    positions_ptr,  # [T] int32/int64 position of each token
    cos_ptr,  # [max_pos, D/2] contiguous
    sin_ptr,  # [max_pos, D/2] contiguous
    stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h,  # output strides (tokens, heads)
    stride_q_t, stride_q_h, stride_k_t, stride_k_h,  # input strides (tokens, heads)
    num_heads,  # H
    num_kv_heads,  # Hkv
    half,  # D / 2
    BLOCK_H: tl.constexpr,  # >= max(H, Hkv), power of two
    BLOCK_HALF: tl.constexpr,  # >= D / 2, power of two
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + pos * half + offs_d, mask=offs_d < half, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * half + offs_d, mask=offs_d < half, other=0.0).to(tl.float32)
    _rotate_heads(q_out_ptr, q_ptr, stride_qo_t, stride_qo_h, stride_q_t, stride_q_h, token, num_heads,
                  half, cos, sin, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_out_ptr, k_ptr, stride_ko_t, stride_ko_h, stride_k_t, stride_k_h, token, num_kv_heads,
                  half, cos, sin, BLOCK_H, BLOCK_HALF)


def rotary_embedding(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns rotated copies of q [T, H, D] and k [T, Hkv, D]; positions index the caches."""
    op = "rotary_embedding"
    check_tensor(op, "q", q, ndim=3, dtypes=FLOAT_DTYPES)
    tokens, num_heads, head_dim = q.shape
    check_tensor(op, "k", k, ndim=3)
    check_shape(op, "k", k, [tokens, None, head_dim])
    check_same_dtype(op, q=q, k=k)
    if head_dim % 2:
        fail(op, f"head_dim must be even, got {head_dim}")
    check_tensor(op, "positions", positions, ndim=1, dtypes=(torch.int32, torch.int64), contiguous=True)
    check_shape(op, "positions", positions, [tokens])
    for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        check_tensor(op, name, cache, ndim=2, dtypes=FLOAT_DTYPES, contiguous=True)
        check_shape(op, name, cache, [None, head_dim // 2])
    check_shape(op, "sin_cache", sin_cache, list(cos_cache.shape))
    check_devices(op, [("q", q), ("k", k), ("positions", positions), ("cos_cache", cos_cache),
                       ("sin_cache", sin_cache)])

    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens == 0:
        return q_out, k_out
    _rotary_embedding_kernel[(tokens,)](
        q_out, k_out, q, k, positions, cos_cache, sin_cache,
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        num_heads, k.shape[1], head_dim // 2,
        BLOCK_H=next_pow2(max(num_heads, k.shape[1])),
        BLOCK_HALF=next_pow2(head_dim // 2),
        num_warps=4,
    )
    return q_out, k_out
