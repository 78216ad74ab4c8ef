"""Rotary + the KV-cache write: the twin (rotary, then index_copy_ into each cache), and on CUDA the path it
replaced (the rotary kernel, then the copies) against the fused kernel (kernels/rotary_kv.py), one launch."""

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
from kernels import kv_fp8
from kernels.reference import rotary_write_kv_ref, write_kv_ref

BLOCK_SIZE, BLOCKS = 16, 2048


def main() -> None:
    report = Report("rotary_kv", device())
    dev, dtype = report.device, torch.bfloat16
    inv_freq = 1.0 / (100000 ** (torch.arange(0, HEAD_DIM, 2, device=dev).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(8192, device=dev).float(), inv_freq)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    for cache_dtype in ("auto", "fp8"):
        shape = (BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        if cache_dtype == "fp8":
            kc, vc = kv_fp8.allocate(*shape, device=dev), kv_fp8.allocate(*shape, device=dev)
        else:
            kc, vc = torch.zeros(shape, dtype=dtype, device=dev), torch.zeros(shape, dtype=dtype, device=dev)
        for tokens in (1, 32, 512):
            qkv = torch.randn(tokens, width, device=dev).to(dtype)
            positions = torch.randint(0, 8192, (tokens,), device=dev)
            slots = torch.randperm(BLOCKS * BLOCK_SIZE, device=dev)[:tokens]
            args = (qkv, positions, cos, sin, kc, vc, slots, HEADS, KV_HEADS)
            impls = {"reference": lambda a=args: rotary_write_kv_ref(*a)}
            if triton_timed(report):
                from kernels.rotary import rotary_embedding
                from kernels.rotary_kv import rotary_write_kv

                def unfused(qkv=qkv, positions=positions, slots=slots, kc=kc, vc=vc) -> None:
                    n, d = qkv.shape[0], HEAD_DIM
                    q = qkv[:, : HEADS * d].view(n, HEADS, d)
                    k = qkv[:, HEADS * d : (HEADS + KV_HEADS) * d].view(n, KV_HEADS, d)
                    _, k = rotary_embedding(q, k, positions, cos, sin)
                    write_kv_ref(kc, vc, k, qkv[:, (HEADS + KV_HEADS) * d :].view(n, KV_HEADS, d), slots)

                impls["triton rotary + copies"] = unfused
                impls["triton fused"] = lambda a=args: rotary_write_kv(*a)
            measure(report, f"T={tokens} H={HEADS} Hkv={KV_HEADS} D={HEAD_DIM} bf16, {cache_dtype} cache", impls)
    write(report)


if __name__ == "__main__":
    main()
