"""FP8 e4m3 linear: reference (dequantize per call) vs dense bf16 vs W8A8 torch._scaled_mm (vs the kernel on CUDA).

The dense bf16 row is what FP8 replaces; on the CPU the question is whether any FP8 path
beats it (see dataplane/quant for the layer that picks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernels._harness import HIDDEN, INTERMEDIATE, Report, device, measure, triton_timed, write
from kernels.fp8_gemm import fp8_w8a8_linear, w8a8_supported
from kernels.reference import fp8_linear_ref, quantize_fp8_per_channel


def main() -> None:
    report = Report("fp8_gemm", device())
    dev, dtype = report.device, torch.bfloat16
    for k, n in ((HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN)):
        dense = (torch.randn(n, k, device=dev) / k**0.5).to(dtype)
        weight, scale = quantize_fp8_per_channel(dense)
        for m in (1, 32):
            x = torch.randn(m, k, device=dev).to(dtype)
            impls = {"reference": lambda x=x, w=weight, s=scale: fp8_linear_ref(x, w, s),
                     "dense bf16 F.linear": lambda x=x, d=dense: F.linear(x, d)}
            if dev.type == "cpu" or w8a8_supported(dev):
                impls["W8A8 _scaled_mm"] = lambda x=x, w=weight, s=scale: fp8_w8a8_linear(x, w, s)
            if triton_timed(report):
                from kernels.fp8_gemm import fp8_linear

                impls["triton weight-only"] = lambda x=x, w=weight, s=scale: fp8_linear(x, w, s)
            measure(report, f"M={m} {k}->{n} bf16", impls)
    write(report, baseline="dense bf16 F.linear")


if __name__ == "__main__":
    main()
