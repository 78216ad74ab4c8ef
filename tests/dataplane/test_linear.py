"""Linear: float32 on the CPU runs through oneDNN's prepacked weight; the result is F.linear's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dataplane import config
from dataplane.models import layers
from dataplane.models.layers import Linear

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 8, 33, 517])
@pytest.mark.parametrize("out_features,in_features", [(960, 576), (7, 13), (576, 1536)])
def test_packed_float32_matches_f_linear(rows, out_features, in_features):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(out_features, in_features, generator=g) / in_features**0.5
    x = torch.randn(rows, in_features, generator=g)
    lin = Linear(w)
    assert lin.packed
    torch.testing.assert_close(lin(x), F.linear(x, w), atol=1e-4, rtol=1e-4)


@needs_onednn
def test_packed_accepts_strided_rows_and_inference_mode():
    w = torch.randn(64, 40)
    lin = Linear(w)
    x = torch.randn(5, 80)[:, ::2]  # a column view, as attention outputs can be
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, w), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_packed_weight_is_given_back_exactly_and_sized_without_copying():
    w = torch.randn(48, 24)
    lin = Linear(w)
    assert torch.equal(lin.weight, w)
    assert lin.weight_bytes == 48 * 24 * 4
    assert lin._weight is None  # one copy of the weight kept, the packed one


def test_float16_weights_stay_plain():
    w = torch.randn(32, 16).to(torch.float16)
    lin = Linear(w)
    assert not lin.packed and lin.weight is w and lin.weight_bytes == 32 * 16 * 2
    x = torch.randn(3, 16).to(torch.float16)
    assert torch.equal(lin(x), F.linear(x, w))


@needs_onednn
@pytest.mark.parametrize("rows", [1, 4, 33])
def test_bf16_packed_where_native_and_equal_to_f_linear(rows, monkeypatch):
    """bf16 packs only where the CPU multiplies bf16 natively; either way the result is F.linear's, bit for bit."""
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(96, 48, generator=g) / 7).to(torch.bfloat16)
    x = torch.randn(rows, 96, generator=g)[:, ::2].to(torch.bfloat16)  # a strided view, as attention outputs are
    lin = Linear(w)
    assert lin.packed == config.cpu_has_native_bf16()
    assert lin.storage_dtype is torch.bfloat16 and lin.weight_bytes == 96 * 48 * 2
    assert torch.equal(lin.weight, w)
    with torch.inference_mode():
        assert torch.equal(lin(x), F.linear(x, w))
    monkeypatch.setattr(layers, "cpu_has_native_bf16", lambda: False)  # an AVX2 host: bf16 is emulated there
    emulated = Linear(w)
    assert not emulated.packed and emulated.weight is w


def test_switch_off_by_environment(monkeypatch):
    monkeypatch.setenv("TESSERA_ONEDNN_LINEAR", "0")
    w = torch.randn(8, 4)
    lin = Linear(w)
    assert not lin.packed and lin.weight is w


def test_pack_failure_falls_back_to_f_linear(monkeypatch):
    def refuse(*_args):
        raise RuntimeError("no packing on this CPU")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse, raising=False)
    w = torch.randn(8, 4)
    lin = Linear(w)
    assert not lin.packed
    x = torch.randn(2, 4)
    assert torch.equal(lin(x), F.linear(x, w))
    assert layers._onednn_pack(w) is None


def test_tied_head_counts_once_unless_packed(monkeypatch):
    """A tied lm head shares the embedding's bytes only while it computes on the embedding itself."""
    embed = torch.randn(100, 16)
    monkeypatch.setenv("TESSERA_ONEDNN_LINEAR", "0")
    assert Linear(embed).holds(embed)
    monkeypatch.setenv("TESSERA_ONEDNN_LINEAR", "1")
    packed = Linear(embed)
    assert packed.packed == torch.backends.mkldnn.is_available()
    assert packed.holds(embed) is not packed.packed


# -- float16 storage (FBGEMM): float32 maths on float16-rounded weights ---------------------------

needs_fp16 = pytest.mark.skipif(not config.fp16_weights_supported(), reason="no FBGEMM fp16 GEMM on this CPU")


@needs_fp16
@pytest.mark.parametrize("rows", [1, 3, 8, 33, 517])
@pytest.mark.parametrize("out_features,in_features", [(960, 576), (7, 13), (576, 1536)])
def test_fp16_storage_is_f_linear_on_the_rounded_weight(rows, out_features, in_features):
    g = torch.Generator().manual_seed(rows + out_features)
    w = torch.randn(out_features, in_features, generator=g) / in_features**0.5
    x = torch.randn(rows, in_features, generator=g)
    lin = Linear(w, storage=torch.float16)
    assert lin.packed and lin.storage_dtype is torch.float16
    # Exactly F.linear's maths on the float16 values (float32 accumulation, order aside) ...
    torch.testing.assert_close(lin(x), F.linear(x, w.half().float()), atol=2e-5, rtol=1e-5)
    # ... which are within float16's rounding of the float32 weight's result.
    ref = F.linear(x, w)
    err = (lin(x) - ref).abs().max() / ref.abs().max()
    assert 0 < err < 2e-3


@needs_fp16
def test_fp16_storage_halves_the_bytes_and_gives_back_the_rounded_weight():
    w = torch.randn(48, 24)
    lin = Linear(w, storage=torch.float16)
    assert lin.weight_bytes == 48 * 24 * 2 and lin._weight is None
    assert lin.weight.dtype == torch.float32 and torch.equal(lin.weight, w.half().float())
    assert not lin.holds(w)


@needs_fp16
def test_fp16_storage_takes_strided_and_batched_rows_in_inference_mode():
    w = torch.randn(64, 40)
    lin = Linear(w, storage=torch.float16)
    x = torch.randn(5, 80)[:, ::2]
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, w.half().float()), atol=2e-5, rtol=1e-5)
    x3 = torch.randn(2, 3, 40)
    assert lin(x3).shape == (2, 3, 64)


@pytest.mark.parametrize("bad", [70000.0, float("inf"), float("nan")])
def test_weights_float16_cannot_hold_stay_float32(bad):
    w = torch.randn(16, 8)
    w[3, 2] = bad
    lin = Linear(w, storage=torch.float16)
    assert lin.storage_dtype is torch.float32 and lin.weight_bytes == 16 * 8 * 4


def test_fp16_pack_failure_falls_back_to_float32(monkeypatch):
    def refuse(*_args):
        raise RuntimeError("FBGEMM needs AVX2")

    monkeypatch.setattr(torch.ops.quantized, "linear_prepack_fp16", refuse, raising=False)
    w = torch.randn(8, 4)
    lin = Linear(w, storage=torch.float16)
    assert lin.storage_dtype is torch.float32
    x = torch.randn(2, 4)
    torch.testing.assert_close(lin(x), F.linear(x, w), atol=1e-5, rtol=1e-5)


def test_other_storage_is_refused():
    with pytest.raises(ValueError, match="bfloat16 storage is not supported"):
        Linear(torch.randn(4, 4), storage=torch.bfloat16)
    half = torch.randn(4, 4).half()
    assert Linear(half, storage=torch.float16).weight is half  # already float16: kept as it is
