"""Rotary embedding and the KV-cache write in one launch, from the fused qkv projection's output.

Per layer the kernel path ran the rotary kernel (q and k copied out rotated) and then two
`index_copy_`s into the caches (four ops more with an FP8 cache: quantize, then copy): three to
seven launches a layer, 90 to 210 a step of a 30-layer model, where a decode step's GPU work is
~1.6 ms. Here one program per token reads its q, k and v rows from qkv once, writes the rotated q,
and stores the rotated k and v at the token's cache slot, quantized in the kernel for an FP8 cache.
The rotated k is not returned: the attention kernels read this step's keys back from the cache.

Twin: `reference.rotary_write_kv_ref` (the rotary reference, then `write_kv_ref`); the same bytes
in the cache for the same inputs, FP8 included (`e4m3_bits` rounds as torch's cast does, with
integer ops, so no FP8 conversion instruction is needed: sm80 has none).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import kv_fp8
from kernels._launch import FLOAT_DTYPES, check_devices, check_shape, check_tensor, fail, next_pow2


@triton.jit
def e4m3_bits(y):
    """float32 tile with |y| <= 448 -> int32 tile of its float8 E4M3 byte, rounded to nearest even as
    torch's `.to(torch.float8_e4m3fn)` rounds. Normal results: the float32 bits' exponent and top 3
    mantissa bits, rounded by adding half an E4M3 unit (minus one, plus the kept lowest bit); a carry
    moves into the exponent as it should. Below 2^-6 (E4M3's subnormals, steps of 2^-9): y * 2^9
    rounded to an integer 0..8 by the 2^23 trick (8 is the smallest normal's code, as it should be)."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - (120 << 3)  # exponent bias 127 -> 7
    a = mag.to(tl.float32, bitcast=True)
    subnormal = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    return sign | tl.where(a < 0.015625, subnormal, normal)


@triton.jit
def _store_rows(cache_ptr, base, offs_d, x1, x2, mask, head_mask, half, FP8: tl.constexpr):
    """Store rows [BLOCK_H, 2 * half], given as halves x1 and x2 (float32 values already rounded to
    the model's dtype), at cache_ptr + base [BLOCK_H]: as they are, or in the FP8 layout (the E4M3
    bytes, then the row's float16 scale, little-endian)."""
    row = cache_ptr + base[:, None] + offs_d[None, :]
    if FP8:
        amax = tl.maximum(tl.max(tl.abs(x1), axis=1), tl.max(tl.abs(x2), axis=1))
        # kv_fp8.quantize: amax / 448, at least float16's least normal, rounded to float16 once
        scale = tl.maximum(tl.div_rn(amax, 448.0), 6.103515625e-05).to(tl.float16)
        s = scale.to(tl.float32)[:, None]
        b1 = e4m3_bits(tl.minimum(tl.maximum(tl.div_rn(x1, s), -448.0), 448.0))
        b2 = e4m3_bits(tl.minimum(tl.maximum(tl.div_rn(x2, s), -448.0), 448.0))
        tl.store(row, b1.to(tl.uint8), mask=mask)
        tl.store(row + half, b2.to(tl.uint8), mask=mask)
        sbits = scale.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        tl.store(cache_ptr + base + 2 * half, (sbits & 0xFF).to(tl.uint8), mask=head_mask)
        tl.store(cache_ptr + base + 2 * half + 1, (sbits >> 8).to(tl.uint8), mask=head_mask)
    else:
        dtype = cache_ptr.dtype.element_ty
        tl.store(row, x1.to(dtype), mask=mask)
        tl.store(row + half, x2.to(dtype), mask=mask)


@triton.jit
def _rotary_write_kv_kernel(
    q_out_ptr,  # [T, H, D] rotated q, contiguous
    key_cache_ptr,  # [blocks, block_size, Hkv, W] contiguous; W = D, or D + 2 bytes for FP8
    value_cache_ptr,  # likewise
    qkv_ptr,  # [T, (H + 2 Hkv) D] unit stride along the row
    positions_ptr,  # [T] int32/int64
    slots_ptr,  # [T] int32/int64 cache slot (block * block_size + offset) of each token
    cos_ptr,  # [max_pos, D/2] contiguous
    sin_ptr,  # [max_pos, D/2] contiguous
    stride_qkv,  # qkv's row stride
    num_heads,  # H
    num_kv_heads,  # Hkv
    half,  # D / 2
    row_width,  # W: elements (bytes for FP8) of one (token, KV head) row of the caches
    FP8: tl.constexpr,  # the caches are uint8 rows in kernels/kv_fp8.py's layout
    BLOCK_H: tl.constexpr,  # >= max(H, Hkv), power of two
    BLOCK_HALF: tl.constexpr,  # >= D / 2, power of two
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    cos = tl.load(cos_ptr + pos * half + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * half + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    head_dim = 2 * half
    src = qkv_ptr + token * stride_qkv + offs_h[:, None] * head_dim + offs_d[None, :]

    mask = (offs_h[:, None] < num_heads) & d_mask[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    dst = q_out_ptr + token * num_heads * head_dim + offs_h[:, None] * head_dim + offs_d[None, :]
    dtype = q_out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(dst + half, (x2 * cos + x1 * sin).to(dtype), mask=mask)

    head_mask = offs_h < num_kv_heads
    mask = head_mask[:, None] & d_mask[None, :]
    base = (slot * num_kv_heads + offs_h) * row_width  # each KV head's row in the flattened cache
    k_src = src + num_heads * head_dim
    x1 = tl.load(k_src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(k_src + half, mask=mask, other=0.0).to(tl.float32)
    # rounded to the model's dtype first: the cache holds (or, FP8, quantizes) what the twin's k holds
    k1 = (x1 * cos - x2 * sin).to(dtype).to(tl.float32)
    k2 = (x2 * cos + x1 * sin).to(dtype).to(tl.float32)
    _store_rows(key_cache_ptr, base, offs_d, k1, k2, mask, head_mask, half, FP8)
    v_src = k_src + num_kv_heads * head_dim
    v1 = tl.load(v_src, mask=mask, other=0.0).to(tl.float32)
    v2 = tl.load(v_src + half, mask=mask, other=0.0).to(tl.float32)
    _store_rows(value_cache_ptr, base, offs_d, v1, v2, mask, head_mask, half, FP8)


def rotary_write_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor, heads: int,
                    kv_heads: int) -> torch.Tensor:
    """q [T, H, D] rotated (NeoX / HF rotate_half, angles cos/sin_cache [max_pos, D/2] at `positions`) from
    qkv [T, (H + 2 Hkv) D]; the rotated k and v stored at `slots` [T] of the caches ([blocks, block_size,
    Hkv, D] in qkv's dtype, or kernels/kv_fp8.py's uint8 layout). Slots must lie inside the caches."""
    op = "rotary_write_kv"
    check_tensor(op, "qkv", qkv, ndim=2, dtypes=FLOAT_DTYPES)
    tokens, width = qkv.shape
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        fail(op, f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    if width % (heads + 2 * kv_heads):
        fail(op, f"qkv's width {width} is not (heads + 2 kv_heads) = {heads + 2 * kv_heads} head rows")
    head_dim = width // (heads + 2 * kv_heads)
    if head_dim % 2:
        fail(op, f"head_dim must be even, got {head_dim}")
    for name, index in (("positions", positions), ("slots", slots)):
        check_tensor(op, name, index, ndim=1, dtypes=(torch.int32, torch.int64), contiguous=True)
        check_shape(op, name, index, [tokens])
    for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        check_tensor(op, name, cache, ndim=2, dtypes=FLOAT_DTYPES, contiguous=True)
        check_shape(op, name, cache, [None, head_dim // 2])
    check_shape(op, "sin_cache", sin_cache, list(cos_cache.shape))
    fp8 = kv_fp8.is_fp8(key_cache)
    row = kv_fp8.row_bytes(head_dim) if fp8 else head_dim
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_tensor(op, name, cache, ndim=4, contiguous=True)
        check_shape(op, name, cache, [None, None, kv_heads, row])
        if cache.dtype != (torch.uint8 if fp8 else qkv.dtype):
            fail(op, f"{name} must be {'uint8 (FP8 layout)' if fp8 else qkv.dtype} like key_cache/qkv, "
                     f"got {cache.dtype}")
    check_devices(op, [("qkv", qkv), ("positions", positions), ("slots", slots), ("cos_cache", cos_cache),
                       ("sin_cache", sin_cache), ("key_cache", key_cache), ("value_cache", value_cache)])

    q = torch.empty((tokens, heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    _rotary_write_kv_kernel[(tokens,)](
        q, key_cache, value_cache, qkv, positions, slots, cos_cache, sin_cache,
        qkv.stride(0), heads, kv_heads, head_dim // 2, row,
        FP8=fp8, BLOCK_H=next_pow2(max(heads, kv_heads)), BLOCK_HALF=next_pow2(head_dim // 2),
        num_warps=4,
    )
    return q
