"""The FP8 KV cache layout (kernels/kv_fp8.py) and the torch references reading it."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_decode, kv_fp8
from kernels.reference import paged_decode_attention_ref, prefill_attention_ref
from tests.kernels.fp8_cache import fp8_paged_cache


def test_rows_round_trip_within_e4m3_precision() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 64, generator=gen) * 10 ** (torch.rand(64, 3, 1, generator=gen) * 8 - 4)
    rows = kv_fp8.quantize(x)
    assert rows.dtype == torch.uint8 and rows.shape == (64, 3, 66)
    back = kv_fp8.dequantize(rows)
    scale = kv_fp8.scales(rows).float()[..., None]
    # 3 mantissa bits: half a step is 2^-4 of a normal value; below 2^-6 x scale the steps are 2^-9 x scale.
    assert ((back - x).abs() <= x.abs() * 2**-4 + scale * 2**-10).all()
    # each row's largest value lands on the top of E4M3's range, so no row wastes its bits (rows too small
    # for a normal float16 scale aside)
    big = x.abs().amax(-1) > kv_fp8.FP8_MAX * kv_fp8.MIN_SCALE
    assert 0 < int(big.sum()) < big.numel()
    top = kv_fp8.values(rows).float().abs().amax(-1)[big]
    assert torch.allclose(top, torch.full_like(top, 448.0), rtol=2**-4)


def test_the_scale_is_the_rows_float16_after_the_values() -> None:
    x = torch.zeros(2, 1, 8)
    x[0, 0, 3] = -896.0  # scale 2.0 exactly
    rows = kv_fp8.quantize(x)
    assert rows[0, 0, 8:].view(torch.float16).item() == 2.0
    assert kv_fp8.values(rows)[0, 0, 3].float().item() == -448.0
    # an all-zero row: the smallest normal float16 scale, values 0 (no 0 / 0)
    assert rows[1, 0, 8:].view(torch.float16).item() == kv_fp8.MIN_SCALE
    assert kv_fp8.dequantize(rows)[1].abs().sum() == 0


def test_values_beyond_float16_scales_still_quantize() -> None:
    x = torch.tensor([[[3e4, -1e4, 1.0, 0.0]]])
    back = kv_fp8.dequantize(kv_fp8.quantize(x))
    assert torch.isfinite(back).all()
    assert (back - x).abs().max() <= 3e4 * 2**-4


def test_odd_head_dims_are_refused_at_allocation() -> None:
    with pytest.raises(ValueError, match="even head_dim"):
        kv_fp8.allocate(2, 16, 1, 63)
    assert kv_fp8.cache_head_dim(kv_fp8.allocate(2, 16, 3, 40)) == 40


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 40)])
def test_references_read_fp8_as_its_dequantized_values(heads, kv_heads, head_dim) -> None:
    lens = [1, 17, 130]
    k8, v8, tables, kd, vd = fp8_paged_cache(16, 16, kv_heads, head_dim, lens)
    q = torch.randn(len(lens), heads, head_dim)
    ctx = torch.tensor(lens, dtype=torch.int32)
    torch.testing.assert_close(paged_decode_attention_ref(q, k8, v8, tables, ctx, 0.125),
                               paged_decode_attention_ref(q, kd, vd, tables, ctx, 0.125), rtol=0, atol=0)
    q_lens = [1, 5, 30]
    cu = torch.tensor([0, 1, 6, 36], dtype=torch.int32)
    qp = torch.randn(sum(q_lens), heads, head_dim)
    torch.testing.assert_close(prefill_attention_ref(qp, k8, v8, tables, cu, ctx, 0.125),
                               prefill_attention_ref(qp, kd, vd, tables, cu, ctx, 0.125), rtol=0, atol=0)


# --- the C++ CPU ops reading FP8 (kernels/cpu/decode_math.h) ----------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (8, 1, 40), (2, 1, 6)])
def test_cpu_decode_attention_reads_fp8_as_the_reference_does(dtype, heads, kv_heads, head_dim) -> None:
    # head_dim 6: no 8-wide vector step at all (the scalar table); 40: five vector steps; lengths at block
    # edges, a long one and an empty one.
    if not cpu_decode.available():
        pytest.skip("no C++ CPU kernels here")
    lens = [1, 16, 17, 95, 0]
    k8, v8, tables, _, _ = fp8_paged_cache(40, 16, kv_heads, head_dim, lens, seed=head_dim)
    q = torch.randn(len(lens), heads, head_dim).to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    out = cpu_decode.paged_decode_attention(q, k8, v8, tables, ctx, head_dim**-0.5)
    ref = paged_decode_attention_ref(q, k8, v8, tables, ctx, head_dim**-0.5)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol * float(ref.abs().max()), rtol=tol)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


def test_cpu_decode_attention_refuses_an_fp8_cache_of_the_wrong_width() -> None:
    if not cpu_decode.available():
        pytest.skip("no C++ CPU kernels here")
    k8 = kv_fp8.allocate(4, 16, 1, 8)
    with pytest.raises(RuntimeError, match="sizes do not match"):
        cpu_decode.paged_decode_attention(torch.zeros(1, 1, 10), k8, k8.clone(), torch.tensor([[0]]),
                                          torch.tensor([3]), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_rope_write_kv_stores_fp8_rows_as_write_kv_does(dtype) -> None:
    # The engine's fused rotary + KV write on an FP8 cache stores exactly kv_fp8.quantize of the k it
    # returns and of v (the C++ quantization is torch's, bit for bit); its k is Rotary.rotate's within rounding.
    if not cpu_decode.available():
        pytest.skip("no C++ CPU kernels here")
    from dataplane.models.attention import write_kv
    from dataplane.models.layers import Rotary

    heads, kv_heads, d, tokens = 9, 3, 64, 5
    rot = Rotary(d, 512, 10000.0, 1.0, torch.device("cpu"))
    gen = torch.Generator().manual_seed(4)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen) * 4).to(dtype)
    qkv[1, -d:] = 0  # an all-zero value row
    positions, slots = torch.tensor([0, 3, 17, 100, 511]), torch.tensor([1, 2, 40, 63, 5])
    kc, vc = kv_fp8.allocate(4, 16, kv_heads, d), kv_fp8.allocate(4, 16, kv_heads, d)
    q, k = cpu_decode.rope_write_kv(qkv, rot.cos_sin, positions, kc, vc, slots, heads, kv_heads)
    kr, vr = kv_fp8.allocate(4, 16, kv_heads, d), kv_fp8.allocate(4, 16, kv_heads, d)
    write_kv(kr, vr, k, qkv[:, (heads + kv_heads) * d :].view(tokens, kv_heads, d), slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    q_ref, k_ref = rot.rotate(qkv, rot.prepare(positions), heads, kv_heads)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=1e-2)
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(k, k_ref, **tol)
    with pytest.raises(RuntimeError, match="head_dim"):  # an FP8 cache of the wrong width
        cpu_decode.rope_write_kv(qkv, rot.cos_sin, positions, kv_fp8.allocate(4, 16, kv_heads, d - 2),
                                 kv_fp8.allocate(4, 16, kv_heads, d - 2), slots, heads, kv_heads)


def test_cpu_decode_attention_decodes_every_e4m3_byte_exactly() -> None:
    # Value rows holding every finite E4M3 byte (scale 1), each attended alone (a one-token context):
    # the output is the row itself, through the vector conversion (8 at a time) and the table (the tail).
    if not cpu_decode.available():
        pytest.skip("no C++ CPU kernels here")
    bits = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)  # 254, no NaN
    d = 18  # two vector steps and a scalar tail of 2
    rows = -(-bits.numel() // d)
    cache = kv_fp8.allocate(rows, 1, 1, d)
    flat = torch.cat([bits, bits[: rows * d - bits.numel()]]).view(rows, 1, 1, d)
    cache[..., :d] = flat
    cache[..., d:] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    out = cpu_decode.paged_decode_attention(torch.zeros(rows, 1, d), cache, cache,
                                            torch.arange(rows).view(rows, 1), torch.ones(rows, dtype=torch.long), 1.0)
    assert torch.equal(out.view(rows, d), flat.view(rows, d).view(torch.float8_e4m3fn).float())
