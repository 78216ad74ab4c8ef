"""FP8 paged caches for the attention tests: random K/V of very different magnitudes per row, quantized."""

from __future__ import annotations

import torch

from kernels import kv_fp8
from tests.kernels.helpers import paged_cache


def fp8_paged_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, context_lens: list[int],
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache) in the FP8 layout, the block tables, and the same caches dequantized to
    float32: what every FP8 op must compute with. Rows are scaled by 10^U(-2, 1.5), so that a per-layer
    scale would lose the small rows and a wrong per-row scale shows."""
    kc, vc, tables = paged_cache(num_blocks, block_size, num_kv_heads, head_dim, torch.float32, context_lens, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    rows = (num_blocks, block_size, num_kv_heads, 1)
    kc = kc * 10 ** (torch.rand(rows, generator=gen) * 3.5 - 2)
    vc = vc * 10 ** (torch.rand(rows, generator=gen) * 3.5 - 2)
    k8, v8 = kv_fp8.quantize(kc), kv_fp8.quantize(vc)
    return k8, v8, tables, kv_fp8.dequantize(k8), kv_fp8.dequantize(v8)
