"""RMSNorm with the fused residual add: reference vs torch.nn.functional.rms_norm (vs the kernel on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernels._harness import HIDDEN, Report, device, measure, triton_timed, write
from kernels.reference import rms_norm_ref


def main() -> None:
    report = Report("rms_norm", device())
    dev, dtype = report.device, torch.bfloat16
    weight = torch.randn(HIDDEN, device=dev).to(dtype)
    for tokens in (1, 32, 512):
        x = torch.randn(tokens, HIDDEN, device=dev).to(dtype)
        residual = torch.randn(tokens, HIDDEN, device=dev).to(dtype)

        def library(x=x, residual=residual):
            h = x + residual
            return F.rms_norm(h, (HIDDEN,), weight, 1e-5), h

        impls = {"reference": lambda x=x, r=residual: rms_norm_ref(x, weight, 1e-5, r),
                 "F.rms_norm (bf16)": library}
        if triton_timed(report):
            from kernels.rms_norm import rms_norm

            impls["triton"] = lambda x=x, r=residual: rms_norm(x, weight, 1e-5, r)
        measure(report, f"T={tokens} hidden={HIDDEN} bf16 +residual", impls)
    write(report)


if __name__ == "__main__":
    main()
