"""The fused rotary + KV-cache write kernel (kernels/rotary_kv.py) against its twin, in Triton's interpreter:
the rotated q within rounding, and the caches byte for byte, in the model's dtype and in the FP8 layout."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels import kv_fp8
from kernels.reference import rotary_write_kv_ref
from kernels.rotary_kv import e4m3_bits, rotary_write_kv
from tests.kernels.helpers import DTYPES, assert_close


def _tables(max_pos: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(half).float() / half))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return freqs.cos(), freqs.sin()


def _caches(fp8: bool, blocks: int, block_size: int, kv_heads: int, d: int, dtype: torch.dtype, gen):
    """Caches already holding other tokens' rows: a write must change only its own slots."""
    if fp8:
        rows = torch.randn(blocks, block_size, kv_heads, d, generator=gen)
        return kv_fp8.quantize(rows), kv_fp8.quantize(rows.flip(0))
    return (torch.randn(blocks, block_size, kv_heads, d, generator=gen).to(dtype),
            torch.randn(blocks, block_size, kv_heads, d, generator=gen).to(dtype))


@pytest.mark.parametrize("fp8", [False, True], ids=["cache in dtype", "fp8 cache"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 40), (2, 1, 6)])
def test_same_q_and_cache_bytes_as_the_twin(fp8, dtype, heads, kv_heads, head_dim) -> None:
    gen = torch.Generator().manual_seed(heads * 100 + head_dim)
    tokens, block_size = 7, 4
    # a wide range of magnitudes per row: FP8 scales, subnormals and rounding ties all get exercised
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
           * torch.logspace(-4, 2, tokens)[:, None]).to(dtype)
    positions = torch.tensor([0, 1, 2, 50, 99, 3, 7])
    slots = torch.tensor([5, 0, 11, 3, 8, 14, 2])  # scattered over 4 blocks
    cos, sin = _tables(100, head_dim // 2)
    kc, vc = _caches(fp8, 4, block_size, kv_heads, head_dim, dtype, gen)
    kr, vr, k0 = kc.clone(), vc.clone(), kc.clone()
    q = rotary_write_kv(qkv, positions, cos, sin, kc, vc, slots, heads, kv_heads)
    q_ref = rotary_write_kv_ref(qkv, positions, cos, sin, kr, vr, slots, heads, kv_heads)
    assert_close(q, q_ref)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    untouched = torch.ones(4 * block_size, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(kc.flatten(0, 1)[untouched], k0.flatten(0, 1)[untouched])
    assert not torch.equal(kc.flatten(0, 1)[slots], k0.flatten(0, 1)[slots])


@triton.jit
def _round_kernel(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, e4m3_bits(tl.load(y_ptr + offs, mask=m, other=0.0)).to(tl.uint8), mask=m)


def test_e4m3_rounding_is_torchs_on_every_code_and_every_tie() -> None:
    """The kernel's float32 -> E4M3 rounding (integer ops) against torch's cast: every representable value,
    every midpoint between neighbours (ties to even), a float32 ulp either side of each, zeros, and 448."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)  # 0x7F is NaN in e4m3fn
    values = codes.view(torch.float8_e4m3fn).float()
    mids = (values[1:] + values[:-1]) / 2
    ulp = lambda x, n: (x.view(torch.int32) + n).view(torch.float32)  # noqa: E731
    pos = torch.cat([values, mids, ulp(mids, 1), ulp(mids, -1), torch.rand(4000) * 448,
                     torch.rand(2000) * 2**-6, torch.tensor([0.0, 448.0, 447.99, 2**-10, 2**-9 * 1.5])])
    pos = pos[(pos >= 0) & (pos <= 448)]
    y = torch.cat([pos, -pos])
    flat = y.contiguous()
    out = torch.empty(flat.shape, dtype=torch.uint8)
    _round_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024)
    want = flat.to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (out != want).nonzero().flatten()
    assert not len(bad), [(float(flat[i]), int(out[i]), int(want[i])) for i in bad[:10]]


def test_slots_as_int32_and_an_empty_batch() -> None:
    qkv = torch.randn(3, (2 + 2) * 8)
    cos, sin = _tables(10, 4)
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    kr, vr = kc.clone(), vc.clone()
    pos32 = torch.tensor([9, 0, 4], dtype=torch.int32)
    slots32 = torch.tensor([7, 0, 4], dtype=torch.int32)
    q = rotary_write_kv(qkv, pos32, cos, sin, kc, vc, slots32, 2, 1)
    assert_close(q, rotary_write_kv_ref(qkv, pos32, cos, sin, kr, vr, slots32, 2, 1))
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    empty = rotary_write_kv(qkv[:0], pos32[:0], cos, sin, kc, vc, slots32[:0], 2, 1)
    assert empty.shape == (0, 2, 8)
    assert torch.equal(kc, kr)


@pytest.mark.parametrize("case,message", [
    ("odd width", r"is not \(heads \+ 2 kv_heads\)"),
    ("bad heads", "positive multiple"),
    ("cache dtype", "key_cache must be"),
    ("cache heads", "key_cache must have shape"),
    ("slots shape", "slots must have shape"),
    ("float slots", "slots must have dtype"),
])
def test_bad_arguments_are_refused_before_launch(case, message) -> None:
    qkv = torch.randn(3, 4 * 8)
    cos, sin = _tables(10, 4)
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    pos, slots = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2])
    args = dict(qkv=qkv, positions=pos, cos_cache=cos, sin_cache=sin, key_cache=kc, value_cache=vc, slots=slots,
                heads=2, kv_heads=1)
    if case == "odd width":
        args["qkv"] = torch.randn(3, 4 * 8 + 1)
    elif case == "bad heads":
        args["kv_heads"] = 3
    elif case == "cache dtype":
        args["key_cache"] = kc.bfloat16()
    elif case == "cache heads":
        args["key_cache"] = args["value_cache"] = torch.zeros(2, 4, 2, 8)
    elif case == "slots shape":
        args["slots"] = slots[:2]
    elif case == "float slots":
        args["slots"] = slots.float()
    before = kc.clone()
    with pytest.raises(ValueError, match=message):
        rotary_write_kv(**args)
    assert torch.equal(kc, before)
