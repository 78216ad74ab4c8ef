"""AutoAWQ's GEMM packing: the documented nibble order, and pack/unpack as inverses."""

from __future__ import annotations

import pytest
import torch

from kernels.awq_layout import (
    AWQ_ORDER,
    AWQ_REVERSE_ORDER,
    awq_dequantize,
    awq_pack,
    awq_quantize,
    awq_unpack,
)


def test_nibble_order_is_autoawqs() -> None:
    # AutoAWQ's WQLinear_GEMM.from_linear: nibble i of each word holds column order_map[i] with
    # order_map = [0, 2, 4, 6, 1, 3, 5, 7]. Columns 0..7 holding the values 0..7 therefore pack to
    # nibbles (low to high) 0,2,4,6,1,3,5,7, i.e. the word 0x75316420.
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    assert [AWQ_ORDER.index(c) for c in range(8)] == list(AWQ_REVERSE_ORDER)
    packed = awq_pack(torch.arange(8).reshape(1, 8))
    assert packed.dtype == torch.int32 and packed.item() == 0x75316420


def test_top_nibble_reaches_the_sign_bit_like_autoawq() -> None:
    values = torch.zeros(1, 8, dtype=torch.int64)
    values[0, 7] = 15  # column 7 sits in nibble 7, bits 28..31
    assert awq_pack(values).item() == -(2**31) + 0x70000000
    assert awq_unpack(awq_pack(values)).tolist() == values.tolist()


@pytest.mark.parametrize("shape", [(1, 8), (5, 16), (128, 72)])
def test_pack_unpack_round_trips(shape: tuple[int, int]) -> None:
    values = torch.randint(0, 16, shape)
    assert torch.equal(awq_unpack(awq_pack(values)).long(), values)
    words = torch.randint(-(2**31), 2**31 - 1, (shape[0], shape[1] // 8), dtype=torch.int32)
    assert torch.equal(awq_pack(awq_unpack(words)), words)


def test_pack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        awq_pack(torch.zeros(2, 7, dtype=torch.int64))
    with pytest.raises(ValueError, match="0..15"):
        awq_pack(torch.full((1, 8), 16))


def test_quantize_layout_shapes_and_exact_grid_values() -> None:
    n, k, group = 24, 256, 128
    # A weight already on a 4-bit grid per group is reproduced exactly.
    steps = torch.randint(0, 16, (n, k)).float()
    scale = torch.rand(n, k // group).half().float() + 0.5
    offset = torch.randint(0, 16, (n, k // group)).float()
    for g in range(k // group):
        steps[:, g * group] = 0  # pin each group's min and max so the min/max rule finds this grid
        steps[:, g * group + 1] = 15
    weight = (steps - offset.repeat_interleave(group, 1)) * scale.repeat_interleave(group, 1)
    qweight, qzeros, scales = awq_quantize(weight, group)
    assert qweight.shape == (k, n // 8) and qzeros.shape == (k // group, n // 8) and scales.shape == (k // group, n)
    assert scales.dtype == torch.float16
    torch.testing.assert_close(awq_dequantize(qweight, qzeros, scales, group).t(), weight, atol=2e-3, rtol=2e-3)
