"""Paged decode and prefill attention kernels against their references (interpreted on the CPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import paged_decode_attention
from kernels.prefill_attention import prefill_attention
from kernels.reference import paged_decode_attention_ref, prefill_attention_ref
from tests.kernels.helpers import DTYPES, assert_close, paged_cache

# (num_heads, num_kv_heads, head_dim): plain MHA, and the real model's 9 heads over 3 KV heads.
HEADS = [(4, 4, 64), (9, 3, 64)]
BLOCK_SIZE = 16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEADS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(dtype, heads, kv_heads, head_dim, num_splits) -> None:
    lens = [1, 15, 16, 17, 130]  # inside one block, block edges, and past one 64-token tile twice
    kc, vc, tables = paged_cache(24, BLOCK_SIZE, kv_heads, head_dim, dtype, lens)
    q = torch.randn(len(lens), heads, head_dim).to(dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode_attention(q, kc, vc, tables, context_lens, head_dim**-0.5, num_splits=num_splits)
    assert_close(out, paged_decode_attention_ref(q, kc, vc, tables, context_lens, head_dim**-0.5))


def test_decode_odd_head_dim_strided_query_and_empty_split() -> None:
    # head_dim 40 pads to a 64-wide tile; q is a strided view of a fused qkv row; with 4 splits
    # the 1-token context leaves three splits empty, which the merge must ignore.
    lens = [1, 45]
    kc, vc, tables = paged_cache(8, BLOCK_SIZE, 2, 40, torch.float32, lens)
    qkv = torch.randn(2, 6 * 40 + 2 * 2 * 40)
    q = qkv[:, : 6 * 40].view(2, 6, 40)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode_attention(q, kc, vc, tables, context_lens, 0.3, num_splits=4)
    assert_close(out, paged_decode_attention_ref(q, kc, vc, tables, context_lens, 0.3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEADS)
def test_prefill_matches_reference(dtype, heads, kv_heads, head_dim) -> None:
    # A plain prompt, one token on a cached prefix, a chunk on a prefix, and a chunk longer than
    # one 64-row query tile whose prefix ends mid-block.
    q_lens = [7, 1, 20, 70]
    lens = [7, 33, 52, 93]
    kc, vc, tables = paged_cache(24, BLOCK_SIZE, kv_heads, head_dim, dtype, lens, seed=3)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim).to(dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = prefill_attention(q, kc, vc, tables, cu, context_lens, head_dim**-0.5)
    assert_close(out, prefill_attention_ref(q, kc, vc, tables, cu, context_lens, head_dim**-0.5))


def test_prefill_with_an_empty_sequence_and_explicit_max_len() -> None:
    q_lens, lens = [3, 0, 5], [10, 4, 5]
    kc, vc, tables = paged_cache(8, BLOCK_SIZE, 1, 16, torch.float32, lens)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    q = torch.randn(8, 2, 16)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = prefill_attention(q, kc, vc, tables, cu, context_lens, 0.25, max_seqlen_q=max(q_lens))
    assert_close(out, prefill_attention_ref(q, kc, vc, tables, cu, context_lens, 0.25))


def test_prefill_of_one_token_equals_decode() -> None:
    lens = [9, 40]
    kc, vc, tables = paged_cache(8, BLOCK_SIZE, 3, 64, torch.float32, lens)
    q = torch.randn(2, 9, 64)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    prefill = prefill_attention(q, kc, vc, tables, torch.tensor([0, 1, 2], dtype=torch.int32), context_lens, 0.125)
    decode = paged_decode_attention(q, kc, vc, tables, context_lens, 0.125)
    assert_close(prefill, decode)
