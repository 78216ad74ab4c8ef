"""The K/V cache operands of the Triton attention kernels, in either layout (kernels/kv_fp8.py).

A 16-bit or float32 cache is read as it lies, in q's dtype. An FP8 cache (uint8 rows of E4M3 values
and a float16 scale) is read as its bytes plus a strided float16 view of its scales; the kernel turns
each byte into a float16 (`fp8_bits_to_f16`) and applies the scale to the scores (keys) and to the
probabilities (values), so the dots still take the cache's exact values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import kv_fp8
from kernels._launch import check_same_dtype, check_shape, fail


@triton.jit
def fp8_bits_to_f16(bits):
    """E4M3 bytes (any integer tile) -> float16 tiles of their values times 2^-8: sign, exponent and
    mantissa moved into a float16's fields (bias 15 against 7, hence the 2^-8; E4M3's subnormals land
    on float16's, exact). Integer ops only: no FP8 conversion instruction needed on any GPU."""
    b = bits.to(tl.uint16)
    return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True)


def check_caches(op: str, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
                 ) -> tuple[bool, torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Shapes and dtypes of both caches against q [*, H, D] -> (fp8, key scales, value scales, their
    strides (block, token, head) for keys then values). Without FP8 the scales are the caches themselves
    (never read)."""
    head_dim = q.shape[-1]
    fp8 = kv_fp8.is_fp8(key_cache)
    width = kv_fp8.row_bytes(head_dim) if fp8 else head_dim
    check_shape(op, "key_cache", key_cache, [None, None, None, width])
    check_shape(op, "value_cache", value_cache, list(key_cache.shape))
    if not fp8:
        check_same_dtype(op, q=q, key_cache=key_cache, value_cache=value_cache)
        return False, key_cache, value_cache, (0,) * 6
    check_same_dtype(op, key_cache=key_cache, value_cache=value_cache)
    if head_dim % 2:
        fail(op, f"an FP8 cache needs an even head_dim, got {head_dim}")
    ks, vs = kv_fp8.scales(key_cache), kv_fp8.scales(value_cache)
    return True, ks, vs, (*ks.stride(), *vs.stride())
