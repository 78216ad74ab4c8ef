"""Prefill attention over a paged prefix: reference vs causal SDPA on contiguous KV (vs the kernel on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernels._harness import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    Report,
    device,
    measure,
    triton_timed,
    write,
)
from kernels.reference import prefill_attention_ref

BLOCK_SIZE = 16


def main() -> None:
    report = Report("prefill_attention", device())
    # (label, [(prefix, new tokens)] per sequence)
    cases = [("1 prompt of 512", [(0, 512)]), ("4 chunks of 128 on 256 cached", [(256, 128)] * 4)]
    for label, seqs in cases:
        _case(report, label, seqs)
    write(report)


def _case(report: Report, label: str, seqs: list[tuple[int, int]]) -> None:
    dev, dtype, scale = report.device, torch.bfloat16, HEAD_DIM**-0.5
    lens = [p + n for p, n in seqs]
    blocks = [-(-n // BLOCK_SIZE) for n in lens]
    kc = torch.randn(sum(blocks), BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=dev).to(dtype)
    vc = torch.randn_like(kc)
    tables = torch.zeros(len(seqs), max(blocks), dtype=torch.int32, device=dev)
    start = 0
    for s, n in enumerate(blocks):
        tables[s, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n
    q_lens = [n for _, n in seqs]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, device=dev).to(dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=dev)

    contiguous = [(torch.randn(1, KV_HEADS, n, HEAD_DIM, device=dev).to(dtype),) * 2 for n in lens]
    masks = [torch.ones(n_new, p + n_new, dtype=torch.bool, device=dev).tril(p) for p, n_new in seqs]

    def sdpa(q=q, cu=cu, contiguous=contiguous, masks=masks):
        outs = []
        for s, ((k, v), mask) in enumerate(zip(contiguous, masks, strict=True)):
            qs = q[int(cu[s]) : int(cu[s + 1])].transpose(0, 1)[None]
            outs.append(F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True))
        return outs

    impls = {"reference": lambda q=q, t=tables, cu=cu, c=context_lens: prefill_attention_ref(
                 q, kc, vc, t, cu, c, scale),
             "SDPA contiguous (bf16)": sdpa}
    if triton_timed(report):
        from kernels.prefill_attention import prefill_attention

        impls["triton"] = lambda q=q, t=tables, cu=cu, c=context_lens: prefill_attention(
            q, kc, vc, t, cu, c, scale, max_seqlen_q=max(q_lens))
    measure(report, f"{label} bf16", impls)


if __name__ == "__main__":
    main()
