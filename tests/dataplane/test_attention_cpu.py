"""The engine's CPU attention path (dataplane.models.attention.paged_attention) against the references."""

from __future__ import annotations

import pytest
import torch

from dataplane.models.attention import (
    AttentionMetadata,
    build_decode_groups,
    make_prefill_chunk,
    paged_attention,
)
from kernels.reference import paged_decode_attention_ref, prefill_attention_ref
from tests.kernels.helpers import DTYPES, assert_close, paged_cache

BLOCK_SIZE = 16
CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4), (8, 2), (12, 6), (8, 8)])  # block-diagonal up to 4 KV heads
def test_decodes_match_reference_across_groups(dtype, heads, kv_heads) -> None:
    # Sorted lengths far enough apart to cut several groups; one context of a single token.
    lens = [1, 15, 16, 17, 40, 130, 131, 300]
    kc, vc, tables = paged_cache(64, BLOCK_SIZE, kv_heads, 32, dtype, lens)
    q = torch.randn(len(lens), heads, 32).to(dtype)
    rows = [tables[i, : -(-n // BLOCK_SIZE)].tolist() for i, n in enumerate(lens)]
    groups = build_decode_groups(lens, rows, BLOCK_SIZE, CPU)
    assert len(groups) > 1
    meta = AttentionMetadata(torch.zeros(len(lens), dtype=torch.long), BLOCK_SIZE, groups)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    expected = paged_decode_attention_ref(q, kc, vc, tables, context_lens, 0.2).view(len(lens), -1)
    for _ in range(2):  # the second layer of a step refills the group's workspace
        out = paged_attention(q, q[:, :kv_heads], q[:, :kv_heads], kc, vc, meta, 0.2)
        assert_close(out, expected)
    assert all(g.workspace is not None for g in groups)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_chunk_over_cached_prefix_matches_reference(dtype) -> None:
    prefix, chunk = 37, 20
    kc, vc, tables = paged_cache(16, BLOCK_SIZE, 3, 32, dtype, [prefix + chunk])
    q = torch.randn(chunk, 9, 32).to(dtype)
    blocks = tables[0, : -(-(prefix + chunk) // BLOCK_SIZE)].tolist()
    meta = AttentionMetadata(torch.zeros(chunk, dtype=torch.long), BLOCK_SIZE,
                             prefills=[make_prefill_chunk(0, chunk, prefix, blocks, CPU)])
    out = paged_attention(q, q[:, :3], q[:, :3], kc, vc, meta, 0.2)
    expected = prefill_attention_ref(q, kc, vc, tables, torch.tensor([0, chunk], dtype=torch.int32),
                                     torch.tensor([prefix + chunk], dtype=torch.int32), 0.2)
    assert_close(out, expected.view(chunk, -1))
