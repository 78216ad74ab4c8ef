"""Rotary embedding on q and k: reference vs transformers' apply_rotary_pos_emb (vs the kernel on CUDA)."""

from __future__ import annotations

import torch

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
from kernels.reference import rotary_embedding_ref


def main() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    report = Report("rotary", device())
    dev, dtype = report.device, torch.bfloat16
    inv_freq = 1.0 / (100000 ** (torch.arange(0, HEAD_DIM, 2, device=dev).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(8192, device=dev).float(), inv_freq)
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    full_cos, full_sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    for tokens in (1, 32, 512):
        q = torch.randn(tokens, HEADS, HEAD_DIM, device=dev).to(dtype)
        k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=dev).to(dtype)
        positions = torch.randint(0, 8192, (tokens,), device=dev)

        def hf(q=q, k=k, positions=positions):
            return apply_rotary_pos_emb(q, k, full_cos[positions], full_sin[positions], unsqueeze_dim=1)

        impls = {"reference": lambda q=q, k=k, p=positions: rotary_embedding_ref(q, k, p, cos, sin),
                 "transformers (bf16)": hf}
        if triton_timed(report):
            from kernels.rotary import rotary_embedding

            impls["triton"] = lambda q=q, k=k, p=positions: rotary_embedding(q, k, p, cos, sin)
        measure(report, f"T={tokens} H={HEADS} Hkv={KV_HEADS} D={HEAD_DIM} bf16", impls)
    write(report)


if __name__ == "__main__":
    main()
