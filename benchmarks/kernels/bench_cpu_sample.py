"""The C++ top-k draw (kernels/cpu/sample_ops.cpp) against its torch twin, reference.sample_top_k_ref
(the sampler's path on other devices): top-k 40, top-p 0.95, temperature 0.8, half the rows seeded,
at batch 1, 32 and 256, over benchmarks.step_overhead's 512-token vocabulary and SmolLM2's 49,152.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from benchmarks.kernels._harness import VOCAB, Report, device, measure, write
from kernels import cpu_sample
from kernels.reference import sample_top_k_ref


def _cycling(fn: Callable[..., torch.Tensor], sets: list[tuple]) -> Callable[[], torch.Tensor]:
    """fn on the next of `sets` at each call."""
    turn = itertools.cycle(sets)
    return lambda: fn(*next(turn))


def main() -> None:
    device()  # the harness's thread count (one unless TESSERA_BENCH_THREADS)
    report = Report("cpu_sample", torch.device("cpu"))
    if not cpu_sample.available():
        report.notes.append("C++ CPU kernels unavailable here: only the reference timed")
    for vocab in (512, VOCAB):
        for rows in (1, 32, 256):
            g = torch.Generator().manual_seed(rows)
            # new logits at every call, as a model gives: the same ones again and again would let the
            # branch predictor learn them (the C++ draw's branchy parts ran 2x faster on repeated input)
            sets = [(torch.randn(rows, vocab, generator=g) * 3, torch.full((rows,), 0.8), 40, None,
                     torch.full((rows,), 0.95), None, torch.empty(rows, 40).exponential_(generator=g),
                     torch.where(torch.arange(rows) % 2 == 0, torch.arange(rows) * 7, -1), torch.arange(rows))
                    for _ in range(8 if vocab * rows < 1 << 22 else 2)]
            impls = {"reference": _cycling(sample_top_k_ref, sets)}
            if cpu_sample.available():
                impls["c++"] = _cycling(cpu_sample.sample_top_k, sets)
            measure(report, f"top-k 40 + top-p, {rows} x {vocab}", impls)
    write(report)


if __name__ == "__main__":
    main()
