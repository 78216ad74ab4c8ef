"""Shared tolerances and builders for the kernel tests."""

from __future__ import annotations

import torch

# Kernel vs reference. float32: both exact up to summation order. bf16/fp16: the kernels round
# attention probabilities and LoRA activations to the input dtype before their tensor-core dots
# (the references keep float32), so allow a couple of output ulps.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = TOLERANCES[dtype or expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """For GEMMs: an error of dot products over K grows with the outputs' scale, not each output's size.

    The kernels round each dequantized weight to the activation dtype before the dot (the
    references do not), so single outputs that cancel to near zero have large relative error.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    rel = TOLERANCES[expected.dtype]["rtol"]
    scale = float(expected.float().abs().max()) or 1.0
    torch.testing.assert_close(actual.float(), expected.float(), atol=rel * scale, rtol=rel)


def paged_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
    context_lens: list[int], seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V caches and block tables that give every sequence distinct, shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    per_seq = [-(-n // block_size) for n in context_lens]
    width = max(per_seq + [1])
    assert sum(per_seq) <= num_blocks, "not enough cache blocks for these contexts"
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(context_lens), width, dtype=torch.int32)
    used = 0
    for s, n in enumerate(per_seq):
        tables[s, :n] = order[used : used + n].to(torch.int32)
        used += n
    return key_cache, value_cache, tables
