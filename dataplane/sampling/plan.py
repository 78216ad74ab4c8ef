"""What a batch's draw needs decided on the host, decided once per SamplingBatch.

Which rows draw, which of top-k / top-p / min-p any of them uses, which are seeded, whether the draw
can run among top-k candidates: about ten numpy calls (~1 µs each at small batches), and on a GPU one
pinned upload per parameter array. A SamplingBatch built for one step uses its plan once; the runner's
kept decode step (runner/steady_decodes.py) keeps its SamplingBatch from step to step, and with it this
plan and the parameters already on the device. Only the seeded rows' output indices move between steps
(their array is updated in place), so they are read and uploaded at every draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# Rows whose top_k is at most this draw among their top_k candidates (one topk); larger ones, and rows
# without a top_k, sort the vocabulary when they have a top_p.
TOPK_CANDIDATES = 1024


def up(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device`: a view on the CPU; on CUDA a pinned copy, uploaded asynchronously."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)


@dataclass(slots=True)
class DrawPlan:
    random: np.ndarray  # rows (of the batch) that draw: temperature > 0
    every: bool  # every row draws
    top_k: np.ndarray | None  # per drawing row; None where no drawing row uses it
    top_p: np.ndarray | None
    min_p: np.ndarray | None
    seeds: np.ndarray | None  # per drawing row, -1 unseeded; None where none is seeded
    seeded: np.ndarray  # drawing rows that are seeded (indices among the drawing rows)
    candidates: bool  # every drawing row has a top_k <= TOPK_CANDIDATES: draw among candidates
    k: int  # candidates per row: the largest top_k, at most the vocabulary
    ragged_k: bool  # some row keeps fewer than k candidates
    _device: dict[str, torch.Tensor] = field(default_factory=dict)  # uploads of the constant arrays

    @staticmethod
    def of(batch: Any, vocab: int) -> DrawPlan:  # noqa: ANN401 - a SamplingBatch (sampler.py imports this module)
        random = np.flatnonzero(batch.temperature > 0)
        every = len(random) == len(batch.temperature)

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else (a if every else a[random])

        top_k, top_p, min_p, seeds = (pick(a) for a in (batch.top_k, batch.top_p, batch.min_p, batch.seeds))
        top_k = top_k if top_k is not None and top_k.any() else None
        top_p = top_p if top_p is not None and (top_p < 1.0).any() else None
        min_p = min_p if min_p is not None and min_p.any() else None
        seeded = np.flatnonzero(seeds >= 0) if seeds is not None else np.zeros(0, dtype=np.int64)
        candidates = top_k is not None and bool(top_k.all()) and int(top_k.max()) <= TOPK_CANDIDATES
        k = int(min(top_k.max(), vocab)) if candidates else 0
        ragged = candidates and bool((top_k < k).any())
        return DrawPlan(random, every, top_k, top_p, min_p, seeds, seeded, candidates, k, ragged)

    def on(self, name: str, device: torch.device, array: np.ndarray) -> torch.Tensor:
        """`array` (one of this plan's constant arrays, named `name`) on `device`, uploaded once."""
        t = self._device.get(name)  # a batch is sampled on one device: its logits'
        if t is None:
            t = self._device[name] = up(array, device)
        return t
