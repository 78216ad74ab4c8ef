"""LoRA shrink/expand kernels for batches that mix adapters, against their references."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as R
from kernels.lora_expand import bgmv_expand, sgmv_expand
from kernels.lora_shrink import bgmv_shrink, sgmv_shrink
from tests.kernels.helpers import DTYPES, assert_close

SLOTS = 3
SCALING = torch.tensor([0.5, 2.0, 1.0])
# Segments of lengths 5, 1, 18, 0, 9: a no-adapter segment, an empty one, one longer than 16.
SEG_INDPTR = torch.tensor([0, 5, 6, 24, 24, 33], dtype=torch.int32)
SEG_IDS = torch.tensor([1, -1, 0, 2, 2], dtype=torch.int32)
TOKENS = 33


def _weights(rank: int, k_in: int, n_out: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    lora_a = (torch.randn(SLOTS, rank, k_in, generator=gen) / k_in**0.5).to(dtype)
    lora_b = (torch.randn(SLOTS, n_out, rank, generator=gen) / rank**0.5).to(dtype)
    return lora_a, lora_b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", [8, 20])
def test_sgmv_shrink_and_expand(dtype, rank) -> None:
    lora_a, lora_b = _weights(rank, 100, 70, dtype)
    x = torch.randn(TOKENS, 100).to(dtype)
    buf = sgmv_shrink(x, lora_a, SCALING, SEG_INDPTR, SEG_IDS)
    ref_buf = R.sgmv_shrink_ref(x, lora_a, SCALING, SEG_INDPTR, SEG_IDS)
    assert_close(buf, ref_buf, dtype)
    y = torch.randn(TOKENS, 70).to(dtype)
    expected = R.sgmv_expand_ref(y.clone(), ref_buf, lora_b, SEG_INDPTR, SEG_IDS)
    got = sgmv_expand(y, ref_buf, lora_b, SEG_INDPTR, SEG_IDS)
    assert got is y
    assert_close(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", [8, 20])
def test_bgmv_shrink_and_expand(dtype, rank) -> None:
    lora_a, lora_b = _weights(rank, 100, 130, dtype)
    token_ids = torch.tensor([0, -1, 2, 2, 1, -1, 0], dtype=torch.int32)
    x = torch.randn(7, 100).to(dtype)
    buf = bgmv_shrink(x, lora_a, SCALING, token_ids)
    ref_buf = R.bgmv_shrink_ref(x, lora_a, SCALING, token_ids)
    assert_close(buf, ref_buf, dtype)
    assert torch.equal(buf[1], torch.zeros(rank))
    y = torch.randn(7, 130).to(dtype)
    expected = R.bgmv_expand_ref(y.clone(), ref_buf, lora_b, token_ids)
    untouched = y[1].clone()
    assert_close(bgmv_expand(y, ref_buf, lora_b, token_ids), expected)
    assert torch.equal(y[1], untouched)


@pytest.mark.parametrize("segmented", [True, False])
def test_expand_into_q_k_v_slices_of_a_fused_output(segmented) -> None:
    # The real model's qkv: q 576 wide, k and v 192 each; one adapter weight per slice.
    q_size, kv_size, rank = 576, 192, 8
    dtype = torch.bfloat16
    x = torch.randn(TOKENS, 64).to(dtype)
    y = torch.randn(TOKENS, q_size + 2 * kv_size).to(dtype)
    expected = y.clone()
    token_ids = R.segments_to_token_ids(SEG_INDPTR, SEG_IDS, TOKENS)
    for offset, width in [(0, q_size), (q_size, kv_size), (q_size + kv_size, kv_size)]:
        lora_a, lora_b = _weights(rank + offset % 7, 64, width, dtype)
        if segmented:
            buf = sgmv_shrink(x, lora_a, SCALING, SEG_INDPTR, SEG_IDS, max_seg_len=18)
            sgmv_expand(y, buf, lora_b, SEG_INDPTR, SEG_IDS, offset, max_seg_len=18)
        else:
            buf = bgmv_shrink(x, lora_a, SCALING, token_ids)
            bgmv_expand(y, buf, lora_b, token_ids, offset)
        ref_buf = R.bgmv_shrink_ref(x, lora_a, SCALING, token_ids)
        R.bgmv_expand_ref(expected, ref_buf, lora_b, token_ids, offset)
    assert_close(y, expected)
