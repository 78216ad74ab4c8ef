"""Paged decode attention: reference vs the engine's CPU path vs block-table gather + SDPA vs SDPA on
contiguous KV (vs the kernel on CUDA).

SDPA on contiguous KV is the floor a paged layout pays to approach: no gather at all. The engine's
CPU path (dataplane.models.attention) is timed as layers 2..N of a step see it: its gather
workspace already allocated by the first layer.
"""

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
from dataplane.models.attention import AttentionMetadata, build_decode_groups, paged_attention
from kernels.reference import paged_decode_attention_ref

BLOCK_SIZE = 16


def _case(batch: int, lens: list[int], dev: torch.device, dtype: torch.dtype):
    blocks_per_seq = [-(-n // BLOCK_SIZE) for n in lens]
    num_blocks = sum(blocks_per_seq)
    key_cache = torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=dev).to(dtype)
    value_cache = torch.randn_like(key_cache)
    perm = torch.randperm(num_blocks, device=dev).to(torch.int32)
    tables = torch.zeros(batch, max(blocks_per_seq), dtype=torch.int32, device=dev)
    start = 0
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = perm[start : start + n]
        start += n
    q = torch.randn(batch, HEADS, HEAD_DIM, device=dev).to(dtype)
    return q, key_cache, value_cache, tables, torch.tensor(lens, dtype=torch.int32, device=dev)


def main() -> None:
    report = Report("paged_attention", device())
    dev, dtype, scale = report.device, torch.bfloat16, HEAD_DIM**-0.5
    gen = torch.Generator().manual_seed(0)
    for batch, label in ((1, "ctx 512"), (32, "ctx 64..1024 mixed"), (32, "ctx 512 all")):
        if label.startswith("ctx 64"):
            lens = torch.randint(64, 1025, (batch,), generator=gen).tolist()
        else:
            lens = [512] * batch
        q, kc, vc, tables, context_lens = _case(batch, lens, dev, dtype)
        max_len = max(lens)
        mask = (torch.arange(tables.shape[1] * BLOCK_SIZE, device=dev)[None, :] < context_lens[:, None])[:, None, None]

        def gather_sdpa(q=q, kc=kc, vc=vc, tables=tables, mask=mask):
            k = kc[tables.long()].flatten(1, 2).transpose(1, 2)
            v = vc[tables.long()].flatten(1, 2).transpose(1, 2)
            return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask, scale=scale, enable_gqa=True)

        order = sorted(range(batch), key=lambda i: lens[i])  # the runner sorts decodes by context length
        groups = build_decode_groups([lens[i] for i in order],
                                     [tables[i, : -(-lens[i] // BLOCK_SIZE)].tolist() for i in order], BLOCK_SIZE, dev)
        meta = AttentionMetadata(torch.zeros(batch, dtype=torch.long), BLOCK_SIZE, groups)
        q_sorted = q[order].contiguous()

        k_contig = torch.randn(batch, KV_HEADS, max_len, HEAD_DIM, device=dev).to(dtype)
        v_contig = torch.randn_like(k_contig)
        impls = {
            "reference": lambda q=q, kc=kc, vc=vc, t=tables, c=context_lens: paged_decode_attention_ref(
                q, kc, vc, t, c, scale),
            "engine CPU path (bf16)": lambda q=q_sorted, kc=kc, vc=vc, meta=meta: paged_attention(
                q, q, q, kc, vc, meta, scale),
            "gather + SDPA (bf16)": gather_sdpa,
            "SDPA contiguous (bf16)": lambda q=q, k=k_contig, v=v_contig: F.scaled_dot_product_attention(
                q[:, :, None], k, v, scale=scale, enable_gqa=True),
        }
        if triton_timed(report):
            from kernels.paged_attention import paged_decode_attention

            impls["triton"] = lambda q=q, kc=kc, vc=vc, t=tables, c=context_lens: paged_decode_attention(
                q, kc, vc, t, c, scale)
        measure(report, f"batch={batch} {label} bf16", impls)
    write(report)


if __name__ == "__main__":
    main()
