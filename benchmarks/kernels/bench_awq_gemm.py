"""AWQ W4A16 GEMM: reference (dequantize per call) vs dense bf16 vs torch's packed int4 CPU matmul
(vs the Triton kernel on CUDA). Group size 64: SmolLM2's 576-wide inputs rule out 128.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernels._harness import HIDDEN, INTERMEDIATE, Report, device, measure, triton_timed, write
from kernels.awq_layout import awq_quantize
from kernels.reference import awq_gemm_ref

GROUP = 64


def main() -> None:
    from dataplane.quant import Int4Linear

    report = Report("awq_gemm", device())
    dev, dtype = report.device, torch.bfloat16
    for k, n in ((HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN)):
        dense = (torch.randn(n, k) / k**0.5).to(dtype)
        qweight, qzeros, scales = awq_quantize(dense.float(), GROUP)
        qweight, qzeros, scales, dense = qweight.to(dev), qzeros.to(dev), scales.to(dev), dense.to(dev)
        int4 = Int4Linear.from_awq(qweight, qzeros, scales, GROUP) if dev.type == "cpu" else None
        for m in (1, 32):
            x = torch.randn(m, k, device=dev).to(dtype)
            impls = {"reference": lambda x=x, w=(qweight, qzeros, scales): awq_gemm_ref(x, *w, GROUP),
                     "dense bf16 F.linear": lambda x=x, d=dense: F.linear(x, d)}
            if int4 is not None:
                impls["_weight_int4pack_mm_for_cpu"] = lambda x=x, layer=int4: layer(x)
            if triton_timed(report):
                from kernels.awq_gemm import awq_gemm

                impls["triton"] = lambda x=x, w=(qweight, qzeros, scales): awq_gemm(x, *w, GROUP)
            measure(report, f"M={m} {k}->{n} g{GROUP} bf16", impls)
    write(report, baseline="dense bf16 F.linear")


if __name__ == "__main__":
    main()
