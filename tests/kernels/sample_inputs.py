"""Inputs shared by the tests of the whole-vocabulary draw's twins (C++ and Triton)."""

from __future__ import annotations

import numpy as np
import torch

from dataplane.sampling.sampler import SamplingBatch

FULL_MIXES = {  # rows of the whole-vocabulary draw: what each row carries (0 / 1 / None: off)
    "temperature only": (None, None, None),
    "top_p": (None, "top_p", None),
    "top_k beyond the candidates' limit, some rows off": ("top_k", None, None),
    "top_k, top_p and min_p": ("top_k", "top_p", "min_p"),
    "min_p only": (None, None, "min_p"),
}


def full_inputs(rows: int, vocab: int, seed: int, scale: float) -> dict:
    g = torch.Generator().manual_seed(seed)
    some = torch.rand(rows, generator=g) < 0.6
    return {
        "logits": torch.randn(rows, vocab, generator=g) * scale,
        "temperature": torch.rand(rows, generator=g) + 0.3,
        "top_k": torch.where(some, torch.randint(1, vocab + 1, (rows,), generator=g), 0),
        "top_p": torch.where(some, torch.rand(rows, generator=g) * 0.9 + 0.1, 1.0),
        "min_p": torch.where(some, torch.rand(rows, generator=g) * 0.2, 0.0),
        "seeds": torch.randint(0, 1 << 62, (rows,), generator=g),
        "index": torch.randint(0, 1000, (rows,), generator=g),
    }


# A (seed, output index, token) whose hash has all its top bits set: with 24 bits of it as the uniform,
# (2^24 - 1) + 0.5 rounded to 2^24 in float32, u to 1 and the noise to 0 (found by search).
ZERO_NOISE = (7, 6165, 389)


def top_p_batch() -> SamplingBatch:
    """16 rows for the whole-vocabulary draw (no top_k): temperature 0.9, top-p 0.9 on two rows in three,
    the even rows seeded, row 7 greedy."""
    b = SamplingBatch(np.full(16, 0.9, dtype=np.float32),
                      top_p=np.where(np.arange(16) % 3 == 0, 1.0, 0.9).astype(np.float32))
    b.seeds = np.where(np.arange(16) % 2 == 0, np.arange(16) * 5, -1).astype(np.int64)
    b.output_index = np.arange(16, dtype=np.int64)
    b.temperature[7] = 0.0
    return b
