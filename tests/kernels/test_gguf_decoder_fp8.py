"""The fused GGUF decode step (kernels/cpu/gguf_decoder.cpp) on an FP8 KV cache, against its per-op twin."""

from __future__ import annotations

import pytest
import torch

from kernels import kv_fp8

from .test_gguf_decoder import _both, _model

BLOCK = 16


@pytest.mark.parametrize("lens", [[1], [5, 40, 41], [3, 16, 33, 64, 200]])
def test_fused_step_on_fp8_matches_the_per_op_path(lens):
    model = _model()
    a = model.args
    made = []

    def fp8_caches(blocks, gen):
        shape = (blocks, BLOCK, a.num_kv_heads, a.head_dim)
        made.extend((kv_fp8.quantize(torch.randn(shape, generator=gen) * 3),
                     kv_fp8.quantize(torch.randn(shape, generator=gen))) for _ in range(a.num_layers))
        return made

    out_fused, out_ops, c_fused, c_ops = _both(model, lens, seed=2, make_caches=fp8_caches)
    caches = made
    torch.testing.assert_close(out_fused, out_ops, atol=2e-4 * float(out_ops.abs().max()), rtol=1e-4)
    for (kf, vf), (ko, vo), (k0, v0) in zip(c_fused, c_ops, caches, strict=True):
        # this step's rows written (quantized alike, but for a rounding step where the rotations differ in
        # their last bit), and nothing else
        for got, want, before in ((kf, ko, k0), (vf, vo, v0)):
            written = (got != before).any(-1) | (want != before).any(-1)
            assert 0 < int(written.sum()) <= len(lens) * a.num_kv_heads
            deq_got, deq_want = kv_fp8.dequantize(got), kv_fp8.dequantize(want)
            torch.testing.assert_close(deq_got, deq_want, atol=0.07 * float(deq_want.abs().max()), rtol=0)
    # the written value rows are bit for bit what write_kv stores (v needs no rotation)
    assert torch.equal(c_fused[0][1], c_ops[0][1])
