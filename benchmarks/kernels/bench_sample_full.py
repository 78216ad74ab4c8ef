"""The whole-vocabulary draw on the device: the torch twin as the sampler runs it where no hashing draw
exists (an Exp(1) a token drawn, then reference.sample_full_ref's sort, softmax, masks and race) against
the Triton kernel (kernels/sample_full.py: one launch, noise hashed inside), at batch 1, 32 and 256 over
SmolLM2's 49,152 tokens: temperature alone, top-p 0.9, top-k 50, and top-p over nearly flat logits. Only
the reference is timed on the CPU (whose C++ draw `python -m benchmarks.kernels cpu_sample` times)."""

from __future__ import annotations

import torch

from benchmarks.kernels._harness import VOCAB, Report, device, measure, triton_timed, write
from kernels.reference import sample_full_ref

CASES = (("temperature", 3.0, None, None), ("top-p 0.9", 3.0, None, 0.9), ("top-k 50", 3.0, 50, None),
         ("top-p 0.9, flat", 0.3, None, 0.9))


def main() -> None:
    report = Report("sample_full", device())
    dev = report.device
    for rows in (1, 32, 256):
        for case, scale, k, p in CASES:
            g = torch.Generator().manual_seed(rows)
            logits = (torch.randn(rows, VOCAB, generator=g) * scale).to(dev)
            temperature = torch.full((rows,), 0.8, device=dev)
            top_k = None if k is None else torch.full((rows,), k, device=dev)
            top_p = None if p is None else torch.full((rows,), p, device=dev)
            seeds = torch.randint(0, 1 << 62, (rows,), generator=g).to(dev)
            index = torch.arange(rows, device=dev)

            def reference(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p) -> torch.Tensor:
                noise = torch.empty_like(logits).exponential_()
                return sample_full_ref(logits, temperature, top_k, top_p, None, noise)

            impls = {"reference": reference}
            if triton_timed(report):
                from kernels.sample_full import sample_full

                impls["triton"] = lambda a=(logits, temperature, top_k, top_p, None, seeds, index): sample_full(*a)
            measure(report, f"{case}, {rows} x {VOCAB}", impls)
    write(report)


if __name__ == "__main__":
    main()
