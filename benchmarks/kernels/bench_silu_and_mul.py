"""SiLU-and-mul: reference vs eager torch in the model dtype (vs the kernel on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernels._harness import INTERMEDIATE, Report, device, measure, triton_timed, write
from kernels.reference import silu_and_mul_ref


def main() -> None:
    report = Report("silu_and_mul", device())
    dev, dtype = report.device, torch.bfloat16
    for tokens in (1, 32, 512):
        x = torch.randn(tokens, 2 * INTERMEDIATE, device=dev).to(dtype)
        impls = {"reference": lambda x=x: silu_and_mul_ref(x),
                 "F.silu * up (bf16)": lambda x=x: F.silu(x[:, :INTERMEDIATE]) * x[:, INTERMEDIATE:]}
        if triton_timed(report):
            from kernels.silu_and_mul import silu_and_mul

            impls["triton"] = lambda x=x: silu_and_mul(x)
        measure(report, f"T={tokens} I={INTERMEDIATE} bf16", impls)
    write(report)


if __name__ == "__main__":
    main()
