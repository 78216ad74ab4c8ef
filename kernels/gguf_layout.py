"""GGUF's Q4_1 and Q8_0 blocks, and the row layout the CPU kernels read them in, as plain torch.

GGUF stores a quantized [N, K] weight row by row, each row K / 32 blocks of 32 weights:

- Q4_1, 20 bytes: fp16 scale d, fp16 minimum m, 16 bytes of nibbles; byte i holds weight i in
  its low nibble and weight i + 16 in its high one. w = d q + m, q in 0..15.
- Q8_0, 34 bytes: fp16 scale d, 32 int8. w = d q.

The kernels (kernels/cpu/gguf_matmul.cpp) read the same bytes regrouped per row, fields apart:
Q4_1 rows are [all nibbles (K/2) | all d (K/16) | all m (K/16)], Q8_0 rows [all int8 (K) | all d
(K/16)]. The same size as the file's, but the kernel loads eight blocks' scales with one F16C
conversion and two blocks' nibbles with one 32-byte load instead of gathering them from 20- or
34-byte strides. `repack_*` goes from the file's layout to the kernels'; `dequantize_*` reads
the kernels' layout back to float32, exactly (every value is d q + m in float32).
"""

from __future__ import annotations

import torch

QK = 32  # weights per block
Q4_1_BLOCK_BYTES = 20
Q8_0_BLOCK_BYTES = 34


def _blocks(raw: torch.Tensor, rows: int, block_bytes: int, name: str) -> torch.Tensor:
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[0] != rows or raw.shape[1] % block_bytes:
        raise ValueError(f"{name}: expected uint8 [{rows}, blocks x {block_bytes}], got {raw.dtype} {list(raw.shape)}")
    return raw.view(rows, -1, block_bytes)


def repack_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_1 rows uint8 [N, K/32 * 20] -> the kernels' rows [N, K/2 + K/16 + K/16] (same size)."""
    b = _blocks(raw, raw.shape[0], Q4_1_BLOCK_BYTES, "repack_q4_1")
    n = raw.shape[0]
    return torch.cat([b[:, :, 4:].reshape(n, -1), b[:, :, 0:2].reshape(n, -1), b[:, :, 2:4].reshape(n, -1)],
                     dim=1).contiguous()


def repack_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """GGUF Q8_0 rows uint8 [N, K/32 * 34] -> the kernels' rows [N, K + K/16] (same size)."""
    b = _blocks(raw, raw.shape[0], Q8_0_BLOCK_BYTES, "repack_q8_0")
    n = raw.shape[0]
    return torch.cat([b[:, :, 2:].reshape(n, -1), b[:, :, 0:2].reshape(n, -1)], dim=1).contiguous()


def q4_1_fields(packed: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel-layout Q4_1 rows -> (q float32 [N, K/32, 32] in 0..15, d [N, K/32], m [N, K/32])."""
    n, nb = packed.shape[0], in_features // QK
    if packed.dtype != torch.uint8 or tuple(packed.shape) != (n, nb * Q4_1_BLOCK_BYTES):
        raise ValueError(f"q4_1: expected uint8 [N, {nb * Q4_1_BLOCK_BYTES}], got {packed.dtype} {list(packed.shape)}")
    nib = packed[:, : nb * 16].reshape(n, nb, 16)
    q = torch.cat([nib & 0x0F, nib >> 4], dim=-1).float()
    d = packed[:, nb * 16: nb * 18].contiguous().view(torch.float16).float()
    m = packed[:, nb * 18:].contiguous().view(torch.float16).float()
    return q, d, m


def q8_0_fields(packed: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel-layout Q8_0 rows -> (q float32 [N, K/32, 32] in -127..127, d [N, K/32])."""
    n, nb = packed.shape[0], in_features // QK
    if packed.dtype != torch.uint8 or tuple(packed.shape) != (n, nb * Q8_0_BLOCK_BYTES):
        raise ValueError(f"q8_0: expected uint8 [N, {nb * Q8_0_BLOCK_BYTES}], got {packed.dtype} {list(packed.shape)}")
    q = packed[:, : nb * QK].contiguous().view(torch.int8).reshape(n, nb, QK).float()
    d = packed[:, nb * QK:].contiguous().view(torch.float16).float()
    return q, d


def dequantize_q4_1(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """Kernel-layout Q4_1 rows -> float32 [N, K]."""
    q, d, m = q4_1_fields(packed, in_features)
    return (q * d[..., None] + m[..., None]).reshape(packed.shape[0], in_features)


def dequantize_q8_0(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """Kernel-layout Q8_0 rows -> float32 [N, K]."""
    q, d = q8_0_fields(packed, in_features)
    return (q * d[..., None]).reshape(packed.shape[0], in_features)
