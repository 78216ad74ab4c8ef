"""The FP8 KV cache's layout, and its quantize / dequantize in plain torch (the twins of the kernels').

A cache in FP8 is a uint8 tensor [blocks, block_size, Hkv, D + 2]: each (token, KV head) row holds
its D values as float8 E4M3 (`torch.float8_e4m3fn`, max 448) and then its own scale as a float16
(little-endian, bytes D and D + 1). A value is `fp8 * scale`; the scale is the row's absolute
maximum over 448, rounded to float16 once, and the values are quantized against that rounded scale.

Why per token and per KV head, stored in the row, rather than vLLM's default per-layer static scale:
- nothing to calibrate, and a token with an outlier only coarsens its own row, not every row of
  its layer (keys' magnitudes differ by head and by position: rotary mixes channels);
- the block stays self-contained: a block's bytes are its K (or V) and their scales, so whatever
  moves, hashes or copies blocks (the prefix cache today, a second tier or a transfer tomorrow)
  moves the scales with them;
- it costs 2 bytes per D: at D = 64 a row is 66 bytes against 128 in bf16, 1.94x the blocks at
  equal memory (a float32 scale, 68 bytes, would give 1.88x).
The kernels take such a cache where they take a 16-bit one (same signature); they tell them apart by
the dtype (uint8), and read D from the query.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
SCALE_BYTES = 2  # a float16 scale per (token, KV head) row
# The smallest scale: float16's least normal number. A row whose max is below 448 x this (~0.027)
# still quantizes with its 3 mantissa bits down to ~1e-6; an all-zero row gets a scale, not 0 / 0.
MIN_SCALE = float(torch.finfo(torch.float16).tiny)


def is_fp8(cache: torch.Tensor) -> bool:
    """Whether `cache` is in this module's FP8 layout (uint8 rows of values + scale)."""
    return cache.dtype == torch.uint8


def row_bytes(head_dim: int) -> int:
    """Bytes of one (token, KV head) row: the FP8 values and their scale."""
    return head_dim + SCALE_BYTES


def cache_head_dim(cache: torch.Tensor) -> int:
    """D of a cache in either layout."""
    return cache.shape[-1] - SCALE_BYTES if is_fp8(cache) else cache.shape[-1]


def allocate(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """An empty (zero) FP8 cache: every row reads as 0 x scale 0 until written."""
    if head_dim % 2:
        raise ValueError(f"kv_cache_dtype: fp8 needs an even head_dim (its scale is a float16), got {head_dim}")
    return torch.zeros((num_blocks, block_size, num_kv_heads, row_bytes(head_dim)), dtype=torch.uint8, device=device)


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) -> uint8 rows [..., D + 2] in the cache's layout."""
    xf = x.float()
    scale = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(MIN_SCALE).to(torch.float16)
    q = (xf / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return torch.cat([q.view(torch.uint8), scale.view(torch.uint8)], dim=-1)


def values(cache: torch.Tensor) -> torch.Tensor:
    """The FP8 values of a cache (or of rows): a strided view [..., D]."""
    return cache[..., : cache_head_dim(cache)].view(FP8_DTYPE)


def scales(cache: torch.Tensor) -> torch.Tensor:
    """The float16 scales of a cache (or of rows): a strided view [...] (one per row)."""
    return cache.view(torch.float16)[..., cache_head_dim(cache) // 2]


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 rows [..., D + 2] -> [..., D] in `dtype` (the product taken in float32)."""
    return (values(rows).float() * scales(rows).float()[..., None]).to(dtype)


def readable(cache: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A cache as values in `dtype`: dequantized if FP8, else itself (references and tests)."""
    return dequantize(cache, dtype) if is_fp8(cache) else cache
