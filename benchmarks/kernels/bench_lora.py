"""LoRA shrink + expand with mixed adapters: reference vs per-token gathered bmm (vs the kernels on CUDA).

Gathered bmm is the naive library formulation (copy each token's A and B, then batched
matmuls); Punica's SGMV/BGMV exist to avoid exactly that copy.
"""

from __future__ import annotations

import torch

from benchmarks.kernels._harness import HIDDEN, Report, device, measure, triton_timed, write
from kernels import reference as R

SLOTS, RANK = 4, 16


def main() -> None:
    report = Report("lora", device())
    dev, dtype = report.device, torch.bfloat16
    lora_a = (torch.randn(SLOTS, RANK, HIDDEN, device=dev) / HIDDEN**0.5).to(dtype)
    lora_b = (torch.randn(SLOTS, HIDDEN, RANK, device=dev) / RANK**0.5).to(dtype)
    scaling = torch.full((SLOTS,), 2.0, device=dev)
    for tokens, segmented in ((32, False), (512, True)):
        _case(report, tokens, segmented, lora_a, lora_b, scaling)
    write(report)


def _case(report: Report, tokens: int, segmented: bool, lora_a: torch.Tensor, lora_b: torch.Tensor,
          scaling: torch.Tensor) -> None:
    dev, dtype = report.device, lora_a.dtype
    x = torch.randn(tokens, HIDDEN, device=dev).to(dtype)
    y = torch.zeros(tokens, HIDDEN, device=dev).to(dtype)
    if segmented:  # four prompts of 128 tokens, the last without an adapter
        seg_indptr = torch.tensor([0, 128, 256, 384, 512], dtype=torch.int32, device=dev)
        seg_ids = torch.tensor([0, 1, 2, -1], dtype=torch.int32, device=dev)
        token_ids = R.segments_to_token_ids(seg_indptr, seg_ids, tokens)
    else:  # decode: adapters interleaved token by token, a quarter without one
        token_ids = (torch.arange(tokens, device=dev) % (SLOTS + 1) - 1).to(torch.int32)

    def gathered_bmm(x=x, y=y, ids=token_ids):
        live = ids >= 0
        slots = ids[live].long()
        mid = torch.bmm(x[live, None], lora_a[slots].transpose(1, 2)) * scaling[slots, None, None].to(dtype)
        y[live] += torch.bmm(mid, lora_b[slots].transpose(1, 2))[:, 0]
        return y

    if segmented:
        def reference(x=x, y=y):
            buf = R.sgmv_shrink_ref(x, lora_a, scaling, seg_indptr, seg_ids)
            return R.sgmv_expand_ref(y, buf, lora_b, seg_indptr, seg_ids)
    else:
        def reference(x=x, y=y, ids=token_ids):
            return R.bgmv_expand_ref(y, R.bgmv_shrink_ref(x, lora_a, scaling, ids), lora_b, ids)

    impls = {"reference": reference, "gathered bmm (bf16)": gathered_bmm}
    if triton_timed(report):
        from kernels.lora_expand import bgmv_expand, sgmv_expand
        from kernels.lora_shrink import bgmv_shrink, sgmv_shrink

        if segmented:
            impls["triton"] = lambda x=x, y=y: sgmv_expand(
                y, sgmv_shrink(x, lora_a, scaling, seg_indptr, seg_ids, max_seg_len=128),
                lora_b, seg_indptr, seg_ids, max_seg_len=128)
        else:
            impls["triton"] = lambda x=x, y=y, ids=token_ids: bgmv_expand(
                y, bgmv_shrink(x, lora_a, scaling, ids), lora_b, ids)
    kind = "SGMV, 4 segments" if segmented else "BGMV, mixed per token"
    measure(report, f"T={tokens} {kind} r={RANK} {HIDDEN}->{HIDDEN}", impls)


if __name__ == "__main__":
    main()
