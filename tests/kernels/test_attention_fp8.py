"""The Triton paged decode and prefill kernels on an FP8 cache against their references (interpreted)."""

from __future__ import annotations

import pytest
import torch

from kernels import kv_fp8
from kernels.paged_attention import paged_decode_attention
from kernels.prefill_attention import prefill_attention
from kernels.reference import paged_decode_attention_ref, prefill_attention_ref
from tests.kernels.fp8_cache import fp8_paged_cache
from tests.kernels.helpers import DTYPES, assert_close_to_scale

HEADS = [(4, 4, 64), (9, 3, 64), (6, 2, 40)]  # MHA, the real model's GQA, a head_dim that pads the tile
BLOCK_SIZE = 16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEADS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_on_fp8_matches_reference(dtype, heads, kv_heads, head_dim, num_splits) -> None:
    lens = [1, 15, 16, 17, 130]
    k8, v8, tables, _, _ = fp8_paged_cache(24, BLOCK_SIZE, kv_heads, head_dim, lens)
    q = torch.randn(len(lens), heads, head_dim).to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode_attention(q, k8, v8, tables, ctx, head_dim**-0.5, num_splits=num_splits)
    assert_close_to_scale(out, paged_decode_attention_ref(q, k8, v8, tables, ctx, head_dim**-0.5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEADS)
def test_prefill_on_fp8_matches_reference(dtype, heads, kv_heads, head_dim) -> None:
    q_lens, lens = [7, 1, 20, 70], [7, 33, 52, 93]
    k8, v8, tables, _, _ = fp8_paged_cache(24, BLOCK_SIZE, kv_heads, head_dim, lens, seed=3)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim).to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    out = prefill_attention(q, k8, v8, tables, cu, ctx, head_dim**-0.5)
    assert_close_to_scale(out, prefill_attention_ref(q, k8, v8, tables, cu, ctx, head_dim**-0.5))


def test_every_e4m3_value_decodes_exactly() -> None:
    # One key per byte value (NaNs aside), scale 1: with q a one-hot, the scores are the values themselves.
    bits = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n = bits.numel()
    cache = kv_fp8.allocate(-(-n // BLOCK_SIZE), BLOCK_SIZE, 1, 16)
    rows = cache.view(-1, 1, 18)
    rows[:n, 0, 0] = bits
    rows[:n, 0, 16:] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    values = kv_fp8.dequantize(rows[:n])[:, 0, 0]
    assert torch.equal(values, bits.view(torch.float8_e4m3fn).float())
    q = torch.zeros(1, 1, 16)
    q[0, 0, 0] = 1.0
    tables = torch.arange(cache.shape[0], dtype=torch.int32)[None]
    # softmax over one key at a time is 1: attend to each key alone through a one-token context by
    # putting key i first in its own table
    for i in range(0, n, 37):
        t = tables.clone()
        t[0, 0] = i // BLOCK_SIZE
        one = cache.clone()
        one.view(-1, 1, 18)[t[0, 0] * BLOCK_SIZE] = rows[i]
        out = paged_decode_attention(q, one, one, t, torch.tensor([1], dtype=torch.int32), 1.0)
        assert out[0, 0, 0].item() == values[i].item()


def test_an_fp8_cache_of_the_wrong_width_is_refused() -> None:
    k8 = kv_fp8.allocate(4, BLOCK_SIZE, 1, 16)
    with pytest.raises(ValueError, match="key_cache must have shape"):
        paged_decode_attention(torch.zeros(1, 1, 18), k8, k8.clone(), torch.zeros(1, 1, dtype=torch.int32),
                               torch.ones(1, dtype=torch.int32), 1.0)
