"""The C++ draws (kernels/cpu/sample_ops.cpp) against their torch twins (the sampler's path on other
devices): among top-k candidates (reference.sample_top_k_ref: top-k 40, top-p 0.95, temperature 0.8,
half the rows seeded) at batch 1, 32 and 256 over benchmarks.step_overhead's 512-token vocabulary and
SmolLM2's 49,152; and over the whole vocabulary (reference.sample_full_ref, timed given its noise, while
the C++ draw hashes its own: temperature alone, top-p 0.9 over peaked logits, and over nearly flat ones
whose nucleus is most of the vocabulary) at 49,152.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from benchmarks.kernels._harness import VOCAB, Report, device, measure, write
from kernels import cpu_sample
from kernels.reference import sample_full_ref, sample_top_k_ref


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
    for rows in (1, 8, 32):
        for case, scale, top_p in (("temperature", 3.0, None), ("top-p 0.9", 3.0, 0.9), ("top-p 0.9, flat", 0.3, 0.9)):
            g = torch.Generator().manual_seed(rows)
            sets = [(torch.randn(rows, VOCAB, generator=g) * scale, torch.full((rows,), 0.8), None,
                     None if top_p is None else torch.full((rows,), top_p), None,
                     torch.randint(0, 1 << 62, (rows,), generator=g), torch.arange(rows)) for _ in range(2)]
            # the reference is given its noise (an Exp(1) a token, as the sampler draws it there); the
            # C++ draw hashes what it needs inside the timed call
            ref_sets = [(*s[:5], torch.empty(rows, VOCAB).exponential_(generator=g)) for s in sets]
            impls = {"reference": _cycling(sample_full_ref, ref_sets)}
            if cpu_sample.available():
                impls["c++"] = _cycling(cpu_sample.sample_full, sets)
            measure(report, f"whole vocabulary, {case}, {rows} x {VOCAB}", impls)
    write(report)


if __name__ == "__main__":
    main()
