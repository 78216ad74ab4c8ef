"""The fused GGUF decode step (kernels/cpu/gguf_decoder.cpp, models/fused_decode.py) against its twin,
the per-op path of models/llama.py, on small random models whose projections are GGUF blocks."""

from __future__ import annotations

import pytest
import torch

from dataplane.models.attention import AttentionMetadata, build_decode_groups, make_prefill_chunk
from dataplane.models.config import LlamaArgs
from dataplane.models.fused_decode import FusedGgufDecode
from dataplane.models.llama import DecoderLayer, LlamaModel
from dataplane.quant.gguf import GgufLinear
from kernels import gguf_cpu, gguf_layout

from .test_cpu_kernels import _q4_1_raw, _q8_0_raw

BLOCK = 16


def _proj(n: int, k: int, fmt: str, gen: torch.Generator, dense_above: int = 0) -> GgufLinear:
    raw = _q4_1_raw(n, k, gen) if fmt == "Q4_1" else _q8_0_raw(n, k, gen)
    repack = gguf_layout.repack_q4_1 if fmt == "Q4_1" else gguf_layout.repack_q8_0
    return GgufLinear(repack(raw), fmt, k, dense_above=dense_above)


def _model(*, hidden=96, inter=160, layers=3, heads=6, kv_heads=2, head_dim=16, fmts=("Q4_1", "Q8_0"),
           dtype=torch.float32, dense_above=0, seed=0) -> LlamaModel:
    """A random Llama decoder with every projection in GGUF blocks (hidden 96 = 3 blocks: the Q4_1
    pair loop's odd tail; formats alternate between projections)."""
    gen = torch.Generator().manual_seed(seed)
    args = LlamaArgs(vocab_size=300, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position=512, tie_word_embeddings=False)
    qkv = (heads + 2 * kv_heads) * head_dim
    shapes = [(qkv, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter)]
    built = []
    for i in range(layers):
        projs = [_proj(n, k, fmts[(i + j) % len(fmts)], gen, dense_above) for j, (n, k) in enumerate(shapes)]
        built.append(DecoderLayer(
            (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype), projs[0], projs[1],
            (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype), projs[2], projs[3]))
    embed = torch.randn(args.vocab_size, hidden, generator=gen).to(dtype)
    lm_head = _proj(args.vocab_size, hidden, "Q8_0", gen)
    return LlamaModel(args, embed, built, torch.ones(hidden, dtype=dtype), lm_head)


def _caches(model: LlamaModel, blocks: int, gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    a = model.args
    shape = (blocks, BLOCK, a.num_kv_heads, a.head_dim)
    return [(torch.randn(shape, generator=gen).to(model.dtype), torch.randn(shape, generator=gen).to(model.dtype))
            for _ in range(a.num_layers)]


def _decode_step(lens: list[int], blocks: int, gen: torch.Generator):
    """Decode rows at context lengths `lens` (sorted, as the runner sorts them), random block tables."""
    perm = torch.randperm(blocks, generator=gen).tolist()
    tables, slots, start = [], [], 0
    for n in lens:
        need = -(-n // BLOCK)
        tables.append(perm[start : start + need])
        start += need
        slots.append(tables[-1][(n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK)
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), block_size=BLOCK,
                             decode_groups=build_decode_groups(lens, tables, BLOCK, torch.device("cpu")))
    ids = torch.randint(0, 300, (len(lens),), generator=gen)
    return ids, torch.tensor([n - 1 for n in lens]), meta


def _both(model: LlamaModel, lens: list[int], seed: int = 1, make_caches=None):
    """(fused output, per-op output, caches after each) from the same inputs and caches
    (`make_caches(blocks, gen)`: other caches than the model's dtype, e.g. FP8)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // BLOCK) for n in lens) + 3
    caches = (make_caches or (lambda b, g: _caches(model, b, g)))(blocks, gen)
    ids, pos, meta = _decode_step(lens, blocks, gen)
    fused = model.fused
    assert fused is not None and fused.applies(len(lens), meta, None)
    c_fused = [(k.clone(), v.clone()) for k, v in caches]
    c_ops = [(k.clone(), v.clone()) for k, v in caches]
    out_fused = model.hidden_states(ids, pos, meta, c_fused)
    model.fused = None
    try:
        out_ops = model.hidden_states(ids, pos, meta, c_ops)
    finally:
        model.fused = fused
    return out_fused, out_ops, c_fused, c_ops


def test_a_gguf_model_gets_the_fused_step_and_others_do_not():
    model = _model()
    assert gguf_cpu.available() and isinstance(model.fused, FusedGgufDecode)
    model.use_cpu_ops(False)  # the torch ops path (TESSERA_CPU_KERNELS=0 or a benchmark's baseline)
    assert model.fused is None
    model.use_cpu_ops(True)
    assert model.fused is not None
    dense = _model()
    dense.layers[1].down_proj = torch.nn.Linear(160, 96, bias=False)  # one projection not in blocks
    dense.use_cpu_ops(True)
    assert dense.fused is None


@pytest.mark.parametrize("lens", [[1], [17], [5, 40, 41], [3, 16, 33, 64, 200]])
def test_fused_step_matches_the_per_op_path_in_float32(lens):
    # [1]: a first token; 17: one past a block edge; several rows, and lengths far enough apart that
    # the runner cuts them into decode groups of different widths (one padded table here).
    model = _model()
    out_fused, out_ops, c_fused, c_ops = _both(model, lens)
    assert out_fused.shape == out_ops.shape == (len(lens), 96) and out_fused.dtype == torch.float32
    torch.testing.assert_close(out_fused, out_ops, atol=2e-4 * float(out_ops.abs().max()), rtol=1e-4)
    for (kf, vf), (ko, vo) in zip(c_fused, c_ops, strict=True):  # this step's K/V written, nothing else
        torch.testing.assert_close(kf, ko, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(vf, vo, atol=1e-4, rtol=1e-4)


def test_fused_step_in_bfloat16_is_nearer_float32_than_the_per_op_path():
    # bf16 model: the fused step keeps its activations in float32 between ops where the per-op path
    # rounds each to bf16; against the same model run in float32 (same weights, the bf16 caches
    # widened), the fused step's error is the smaller, and the bf16 caches get this step's K/V.
    model = _model(dtype=torch.bfloat16)
    out_fused, out_ops, c_fused, c_ops = _both(model, [9, 30])
    assert out_fused.dtype == torch.bfloat16
    twin = LlamaModel(model.args, model.embed.float(),
                      [DecoderLayer(lay.input_norm.float(), lay.qkv_proj, lay.o_proj, lay.post_norm.float(),
                                    lay.gate_up_proj, lay.down_proj) for lay in model.layers],
                      model.norm.float(), model.lm_head)
    twin.fused = None
    gen = torch.Generator().manual_seed(1)
    blocks = sum(-(-n // BLOCK) for n in [9, 30]) + 3
    caches = [(k.float(), v.float()) for k, v in _caches(model, blocks, gen)]
    ids, pos, meta = _decode_step([9, 30], blocks, gen)
    exact = twin.hidden_states(ids, pos, meta, caches)  # writes float32 K/V into `caches`

    def err(out: torch.Tensor) -> float:
        return float((out.float() - exact).norm() / exact.norm())

    assert err(out_fused) < 0.02 and err(out_fused) < err(out_ops), (err(out_fused), err(out_ops))
    slots = meta.slot_mapping
    for (kf, _), (kx, _) in zip(c_fused, caches, strict=True):  # the written rows, to bf16's precision
        written, want = kf.flatten(0, 1)[slots].float(), kx.flatten(0, 1)[slots]
        assert float((written - want).norm() / want.norm()) < 0.02


def test_one_thread_and_two_give_the_same_step():
    model = _model(layers=2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _both(model, [7, 25])[0]
        torch.set_num_threads(2)
        two = _both(model, [7, 25])[0]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)  # rows are split between threads, never a sum


def test_steps_it_does_not_take_run_the_per_op_path():
    model = _model(dense_above=4)
    fused = model.fused
    gen = torch.Generator().manual_seed(3)
    _, _, meta = _decode_step([5, 6], 8, gen)
    assert fused.applies(2, meta, None)
    assert not fused.applies(5, meta, None)  # above the projections' dense copy: the dense path is faster
    assert not fused.applies(2, meta, lora=object())  # LoRA deltas are added per projection
    prefill = AttentionMetadata(slot_mapping=torch.arange(4), block_size=BLOCK,
                                prefills=[make_prefill_chunk(0, 4, 0, [0], torch.device("cpu"))])
    assert not fused.applies(4, prefill, None)


def test_bad_step_inputs_are_refused_before_anything_runs():
    model = _model(layers=1)
    gen = torch.Generator().manual_seed(5)
    caches = _caches(model, 4, gen)
    ids, pos, meta = _decode_step([20], 4, gen)
    dec = model.fused.decoder
    h = torch.randn(1, 96)
    g = meta.decode_groups[0]
    keys, values = [k for k, _ in caches], [v for _, v in caches]
    before = [k.clone() for k in keys]
    with pytest.raises(RuntimeError, match="block id"):
        dec.forward(h, pos, meta.slot_mapping, torch.tensor([[0, 99]]), g.context_lens, keys, values)
    with pytest.raises(RuntimeError, match="slot"):
        dec.forward(h, pos, torch.tensor([4 * BLOCK]), g.block_tables, g.context_lens, keys, values)
    with pytest.raises(RuntimeError, match="position"):
        dec.forward(h, torch.tensor([10_000]), meta.slot_mapping, g.block_tables, g.context_lens, keys, values)
    with pytest.raises(RuntimeError, match="does not fit"):
        dec.forward(h, pos, meta.slot_mapping, g.block_tables, torch.tensor([33]), keys, values)
    with pytest.raises(RuntimeError, match="one key and one value cache per layer"):
        dec.forward(h, pos, meta.slot_mapping, g.block_tables, g.context_lens, keys * 2, values * 2)
    with pytest.raises(RuntimeError, match=r"h must be \[rows, 96\]"):
        dec.forward(torch.randn(1, 95), pos, meta.slot_mapping, g.block_tables, g.context_lens, keys, values)
    assert all(torch.equal(k, b) for k, b in zip(keys, before, strict=True))  # nothing was written


def test_weights_that_do_not_fit_the_model_are_refused_at_build():
    model = _model(layers=1)
    layer = model.layers[0]
    args = dict(heads=6, kv_heads=2, head_dim=16, eps=1e-5, scale=0.25)
    blocks = [layer.qkv_proj.blocks, layer.o_proj.blocks, layer.gate_up_proj.blocks, layer.down_proj.blocks]
    fmts = [layer.qkv_proj.fmt, layer.o_proj.fmt, layer.gate_up_proj.fmt, layer.down_proj.fmt]
    norms = [layer.input_norm], [layer.post_norm]
    with pytest.raises(RuntimeError, match="qkv has"):
        gguf_cpu.decoder(blocks, fmts, *norms, model.rotary.cos_sin, **{**args, "kv_heads": 3, "heads": 6})
    with pytest.raises(RuntimeError, match="four projections"):
        gguf_cpu.decoder(blocks[:3], fmts[:3], *norms, model.rotary.cos_sin, **args)
    with pytest.raises(ValueError, match="Q4_0"):
        gguf_cpu.decoder(blocks, ["Q4_0", *fmts[1:]], *norms, model.rotary.cos_sin, **args)


def test_two_threads_stepping_one_model_at_once_get_their_own_answers():
    # Two engines may share one loaded model; the C++ step releases the GIL and keeps its buffers in
    # the decoder object, so concurrent calls must not write into each other's activations.
    import threading

    model = _model(layers=2)
    gen = torch.Generator().manual_seed(11)
    blocks = 16
    caches = [_caches(model, blocks, gen) for _ in range(2)]
    steps = [_decode_step([n, n + 30], blocks, gen) for n in (9, 40)]
    alone = [model.fused(ids, pos, meta, [(k.clone(), v.clone()) for k, v in c])
             for (ids, pos, meta), c in zip(steps, caches, strict=True)]
    results: list[list[torch.Tensor]] = [[], []]

    def run(i: int) -> None:
        ids, pos, meta = steps[i]
        for _ in range(30):
            results[i].append(model.fused(ids, pos, meta, [(k.clone(), v.clone()) for k, v in caches[i]]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert all(torch.equal(r, alone[i]) for r in results[i])
