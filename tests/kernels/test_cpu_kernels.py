"""The C++ CPU kernels (kernels/cpu/*.cpp) against their torch twins, and GGUF's blocks read right.

Compiled once per host (kernels/cpu_ext.py); where this host cannot build them the tests fail
rather than skip: CI's machines have g++, and the engine's fast CPU path depends on them.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dataplane.models.loader import read_gguf_blocks
from dataplane.models.registry import resolve_model_path
from kernels import cpu_decode, gguf_cpu, gguf_layout
from kernels.reference import gguf_q4_1_linear_ref, gguf_q8_0_linear_ref, paged_decode_attention_ref


def test_the_extension_builds_here_with_its_vectorized_paths():
    assert gguf_cpu.available() and cpu_decode.available()
    assert gguf_cpu.vectorized()  # an x86 CI host with AVX2: the scalar fallback would be a silent 10x


def _q4_1_raw(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random Q4_1 blocks with finite fp16 scales and minimums of realistic size."""
    raw = torch.randint(0, 256, (n, k // 32 * 20), dtype=torch.uint8, generator=gen)
    b = raw.view(n, -1, 20)
    d = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().view(torch.uint8).view(n, -1, 2)
    m = (torch.randn(n, k // 32, generator=gen) * 0.05).half().view(torch.uint8).view(n, -1, 2)
    b[:, :, 0:2], b[:, :, 2:4] = d, m
    return raw


def _q8_0_raw(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    raw = torch.randint(0, 256, (n, k // 32 * 34), dtype=torch.uint8, generator=gen)
    b = raw.view(n, -1, 34)
    b[:, :, 2:][b[:, :, 2:] == 128] = 129  # Q8_0 values are -127..127
    b[:, :, 0:2] = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().view(torch.uint8).view(n, -1, 2)
    return raw


# Odd row counts (a group of four runs its last row several times), an odd block count (the Q4_1
# pair loop's single tail block), more than 8 blocks with a tail (the scale vectors' padding).
SHAPES = [(1, 32), (7, 96), (33, 288), (64, 576), (5, 1536)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_q4_1_kernel_matches_its_reference(n, k, rows):
    gen = torch.Generator().manual_seed(n * 1000 + k + rows)
    packed = gguf_layout.repack_q4_1(_q4_1_raw(n, k, gen))
    x = torch.randn(rows, k, generator=gen)
    y = gguf_cpu.q4_1_linear(x, packed, n, k)
    ref = gguf_q4_1_linear_ref(x, packed, n, k)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)
    # and the whole scheme stays near the float product with the dequantized weight
    dense = x @ gguf_layout.dequantize_q4_1(packed, k).t()
    assert float((y - dense).abs().max()) < 0.02 * float(dense.abs().max()) + 1e-4


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 4])
def test_q8_0_kernel_matches_its_reference(n, k, rows):
    gen = torch.Generator().manual_seed(n * 1000 + k + rows + 7)
    packed = gguf_layout.repack_q8_0(_q8_0_raw(n, k, gen))
    x = torch.randn(rows, k, generator=gen)
    y = gguf_cpu.q8_0_linear(x, packed, n, k)
    ref = gguf_q8_0_linear_ref(x, packed, n, k)
    torch.testing.assert_close(y, ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations_come_back_in_their_dtype(dtype):
    gen = torch.Generator().manual_seed(3)
    packed = gguf_layout.repack_q4_1(_q4_1_raw(16, 64, gen))
    x = torch.randn(2, 64, generator=gen).to(dtype)
    y = gguf_cpu.q4_1_linear(x, packed, 16, 64)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), gguf_q4_1_linear_ref(x.float(), packed, 16, 64), atol=2e-2, rtol=1e-2)


def test_zero_and_extreme_activations():
    gen = torch.Generator().manual_seed(5)
    packed = gguf_layout.repack_q4_1(_q4_1_raw(8, 64, gen))
    zero = gguf_cpu.q4_1_linear(torch.zeros(1, 64), packed, 8, 64)
    assert torch.equal(zero, torch.zeros(1, 8))  # a block of zeros has d = 0: no 0/0
    big = torch.full((1, 64), 1e30)  # far past any activation, short of float32's overflow
    y = gguf_cpu.q4_1_linear(big, packed, 8, 64)
    assert bool(torch.isfinite(y).all())
    torch.testing.assert_close(y, gguf_q4_1_linear_ref(big, packed, 8, 64), rtol=1e-5, atol=0)


def test_launchers_refuse_bad_shapes_with_a_message():
    packed = gguf_layout.repack_q4_1(_q4_1_raw(8, 64, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match=r"x must be \[rows, 64\]"):
        gguf_cpu.q4_1_linear(torch.randn(1, 32), packed, 8, 64)
    with pytest.raises(ValueError, match="blocks must be contiguous uint8"):
        gguf_cpu.q4_1_linear(torch.randn(1, 64), packed, 9, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_cpu.q8_0_linear(torch.randn(1, 48), torch.zeros(2, 51, dtype=torch.uint8), 2, 48)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        gguf_cpu.q4_1_linear(torch.ones(1, 64, dtype=torch.int32), packed, 8, 64)
    # the raw op (what the layers call) checks in C++ and raises too, never reads out of bounds
    with pytest.raises(RuntimeError, match="blocks must be contiguous uint8"):
        gguf_cpu.raw_op("Q4_1")(torch.randn(1, 64), packed[:4], 8, 64)


@pytest.fixture(scope="module")
def smollm_blocks():
    return read_gguf_blocks(resolve_model_path("smollm2-135m-instruct"))


def test_the_files_blocks_read_back_exactly_as_gguf_dequantizes_them(smollm_blocks):
    reader = gguf.GGUFReader(str(resolve_model_path("smollm2-135m-instruct")))
    by_name = {t.name: t for t in reader.tensors}
    for gguf_name, hf_name in [("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
                               ("blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight"),
                               ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
                               ("token_embd.weight", "model.embed_tokens.weight")]:
        t = by_name[gguf_name]
        n, k = int(t.shape[1]), int(t.shape[0])
        expected = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(n, k))
        fmt, raw = smollm_blocks[hf_name]
        assert fmt == t.tensor_type.name
        packed = (gguf_layout.repack_q4_1 if fmt == "Q4_1" else gguf_layout.repack_q8_0)(raw)
        assert packed.shape == raw.shape  # the kernel layout is the same size as the file's
        deq = gguf_layout.dequantize_q4_1(packed, k) if fmt == "Q4_1" else gguf_layout.dequantize_q8_0(packed, k)
        assert torch.equal(deq, expected)


def test_real_projection_through_the_kernel(smollm_blocks):
    fmt, raw = smollm_blocks["model.layers.2.mlp.gate_proj.weight"]
    packed = gguf_layout.repack_q4_1(raw)
    n, k = packed.shape[0], 576
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(1))
    y = gguf_cpu.q4_1_linear(x, packed, n, k)
    torch.testing.assert_close(y, gguf_q4_1_linear_ref(x, packed, n, k), atol=1e-5, rtol=1e-5)


# --- decode ops ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 32), (8, 1, 40)])
def test_paged_decode_attention_matches_the_reference(dtype, heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads * 100 + kv_heads + d)
    blocks, bs = 24, 16
    kc = torch.randn(blocks, bs, kv_heads, d, generator=gen).to(dtype)
    vc = torch.randn(blocks, bs, kv_heads, d, generator=gen).to(dtype)
    lens = torch.tensor([1, 16, 17, 95, 0], dtype=torch.int32)  # block edges, a long one, an empty one
    tables = torch.stack([torch.randperm(blocks, generator=gen)[:6] for _ in lens]).to(torch.int32)
    q = torch.randn(len(lens), heads, d, generator=gen).to(dtype)
    out = cpu_decode.paged_decode_attention(q, kc, vc, tables, lens, d ** -0.5)
    ref = paged_decode_attention_ref(q, kc, vc, tables, lens, d ** -0.5)
    assert out.dtype == dtype and out.shape == ref.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))  # nothing to attend to: zeros
    # long tables (int64, as the torch path builds them) give the same
    out64 = cpu_decode.paged_decode_attention(q, kc, vc, tables.long(), lens.long(), d ** -0.5)
    assert torch.equal(out, out64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_attention_splits_a_long_lone_sequence_by_kv_head(dtype):
    # One sequence with a long context on two threads runs as one task per KV head (the other
    # path): the same answer as the reference, and as several sequences run per sequence.
    gen = torch.Generator().manual_seed(7)
    blocks, bs, heads, kv_heads, d = 200, 16, 9, 3, 64
    kc = torch.randn(blocks, bs, kv_heads, d, generator=gen).to(dtype)
    vc = torch.randn(blocks, bs, kv_heads, d, generator=gen).to(dtype)
    tables = torch.randperm(blocks, generator=gen)[:190].view(1, -1).to(torch.int32)
    lens = torch.tensor([190 * bs - 5], dtype=torch.int32)
    q = torch.randn(1, heads, d, generator=gen).to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = cpu_decode.paged_decode_attention(q, kc, vc, tables, lens, d ** -0.5)
        many = cpu_decode.paged_decode_attention(q.repeat(3, 1, 1), kc, vc, tables.repeat(3, 1), lens.repeat(3),
                                                 d ** -0.5)
    finally:
        torch.set_num_threads(threads)
    ref = paged_decode_attention_ref(q, kc, vc, tables, lens, d ** -0.5)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    for row in many:
        torch.testing.assert_close(row.float(), out[0].float(), atol=1e-6, rtol=1e-6)


def test_paged_decode_attention_refuses_what_would_read_out_of_bounds():
    kc = torch.zeros(4, 16, 1, 8)
    q = torch.zeros(1, 1, 8)
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_decode.paged_decode_attention(q, kc, kc.clone(), torch.tensor([[7]]), torch.tensor([3]), 1.0)
    with pytest.raises(RuntimeError, match="does not fit"):
        cpu_decode.paged_decode_attention(q, kc, kc.clone(), torch.tensor([[0]]), torch.tensor([17]), 1.0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_decode.paged_decode_attention(q, kc.half(), kc.half(), torch.tensor([[0]]), torch.tensor([3]), 1.0)


@pytest.mark.parametrize("rows,n", [(1, 576), (33, 576), (3, 100)])
def test_rms_norm_matches_torch(rows, n):
    gen = torch.Generator().manual_seed(rows + n)
    x, w = torch.randn(rows, n, generator=gen) * 3, torch.randn(n, generator=gen)
    torch.testing.assert_close(cpu_decode.rms_norm(x, w, 1e-5), F.rms_norm(x, (n,), w, 1e-5), atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="float32 only"):
        cpu_decode.rms_norm(x.bfloat16(), w.bfloat16(), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv_is_rotate_then_write_kv(dtype):
    from dataplane.models.attention import write_kv
    from dataplane.models.layers import Rotary

    gen = torch.Generator().manual_seed(11)
    rot = Rotary(64, 512, 10000.0, 1.0, torch.device("cpu"))
    tokens, heads, kv_heads, d = 5, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    pos, slots = torch.tensor([0, 3, 100, 511, 7]), torch.tensor([0, 17, 33, 5, 63])
    kc, vc = torch.zeros(4, 16, kv_heads, d, dtype=dtype), torch.zeros(4, 16, kv_heads, d, dtype=dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    q, k = rot.rotate(qkv, rot.prepare(pos), heads, kv_heads)
    write_kv(kc, vc, k, qkv[:, (heads + kv_heads) * d:].view(tokens, kv_heads, d), slots)
    q2, k2 = cpu_decode.rope_write_kv(qkv, rot.cos_sin, pos, kc2, vc2, slots, heads, kv_heads)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(q2, q, **tol)
    torch.testing.assert_close(k2, k, **tol)
    torch.testing.assert_close(kc2, kc, **tol)
    assert torch.equal(vc2, vc)  # v is copied, not rounded
    before = kc2.clone()
    with pytest.raises(RuntimeError, match="slot 64 out of range"):  # checked before any write
        cpu_decode.rope_write_kv(qkv[:2], rot.cos_sin, pos[:2], kc2, vc2, torch.tensor([1, 64]), heads, kv_heads)
    assert torch.equal(kc2, before)
    with pytest.raises(RuntimeError, match="beyond the table"):
        cpu_decode.rope_write_kv(qkv[:1], rot.cos_sin, torch.tensor([512]), kc2, vc2, slots[:1], heads, kv_heads)
