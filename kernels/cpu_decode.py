"""Launchers of the C++ decode ops (kernels/cpu/decode_ops.cpp) on the CPU: paged decode attention,
rotary + KV-cache write, and float32 RMSNorm. Twins: `reference.paged_decode_attention_ref`,
`Rotary.rotate` + `write_kv`, and `F.rms_norm`.

`available()` is False where the extension cannot be built (kernels/cpu_ext.py); the engine then
keeps its torch path. `TESSERA_CPU_KERNELS=0` turns them off.
"""

from __future__ import annotations

import torch

from kernels.cpu_ext import extension


def available() -> bool:
    return extension() is not None


def paged_decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [S, H, D], caches [blocks, block_size, Hkv, D] (float32 or bf16, contiguous), block_tables
    [S, W] and context_lens [S] (int32 or int64) -> [S, H, D] in q's dtype; softmax in float32."""
    mod = extension()
    if mod is None:
        raise RuntimeError("cpu kernels: not available on this machine (see the log)")
    if q.device.type != "cpu" or key_cache.device.type != "cpu":
        raise ValueError("paged_decode_attention (CPU): CPU tensors only")
    return mod.paged_decode_attention(q, key_cache, value_cache, block_tables, context_lens, float(scale))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm(x, (n,), weight, eps) for float32 x [rows, n]."""
    mod = extension()
    if mod is None:
        raise RuntimeError("cpu kernels: not available on this machine (see the log)")
    return mod.rms_norm(x, weight, float(eps))


def rope_write_kv(qkv: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, key_cache: torch.Tensor,
                  value_cache: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """models.layers.Rotary.rotate then models.attention.write_kv in one call: q [T, H, D] and k [T, Hkv, D]
    rotated (adjacent pairs, angles cos_sin [max_pos, D/2, 2] float32) from qkv [T, (H + 2 Hkv) D], and
    k and v stored at `slots` of the caches (float32 or bf16, qkv's dtype)."""
    mod = extension()
    if mod is None:
        raise RuntimeError("cpu kernels: not available on this machine (see the log)")
    q, k = mod.rope_write_kv(qkv, cos_sin, positions, key_cache, value_cache, slots, heads, kv_heads)
    return q, k
