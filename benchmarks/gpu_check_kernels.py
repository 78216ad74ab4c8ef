"""Each Triton kernel against its torch twin (kernels/reference.py), one row per case.

Used by `python -m benchmarks.gpu_check` at SmolLM2-135M's production shapes on a CUDA device,
and by tests/kernels/test_gpu_check_table.py at tiny shapes under TRITON_INTERPRET=1 on the CPU:
the same comparison code runs in both places, so the day a GPU is lent only the shapes change.

The kernel modules are imported inside `kernel_table`, never at import of this module: the test
sets TRITON_INTERPRET before they load (see tests/kernels/conftest.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import kv_fp8
from kernels import reference as R
from kernels.seeded_noise import seeded_noise

# The tolerances of tests/kernels/helpers.py: float32 differs by summation order only; 16-bit
# kernels round attention probabilities and LoRA activations to the input dtype before their dots.
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 2e-2),
}


@dataclass(frozen=True, slots=True)
class Shapes:
    tokens: int  # rows through the elementwise kernels and GEMMs (a prefill chunk)
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    decode_contexts: tuple[int, ...]  # one decode sequence per entry
    prefill_chunks: tuple[tuple[int, int], ...]  # (new tokens, context) per prefill sequence
    rank: int  # LoRA rank
    slots: int  # LoRA adapters resident
    awq_group: int
    block_size: int = 16
    vocab: int = 49152  # the sampler's rows
    sample_rows: int = 256


# SmolLM2-135M: hidden 576, MLP 1536, 9 query heads over 3 KV heads of 64; a 32-sequence decode
# batch up to 2k context, a 512-token prefill chunk on a cached prefix; rank-16 LoRA.
PRODUCTION = Shapes(tokens=512, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64,
                    decode_contexts=tuple(64 * i + 17 for i in range(32)),
                    prefill_chunks=((512, 1024), (300, 300), (1, 2047)), rank=16, slots=4, awq_group=128)
# Small enough for Triton's interpreter (seconds), still off the block sizes.
TINY = Shapes(tokens=7, hidden=104, intermediate=64, heads=9, kv_heads=3, head_dim=16,
              decode_contexts=(1, 17, 40), prefill_chunks=((5, 5), (3, 20)), rank=8, slots=2, awq_group=64,
              vocab=1000, sample_rows=24)


@dataclass(slots=True)
class Row:
    kernel: str
    dtype: str
    shape: str
    max_abs_err: float
    allowed: float  # the largest error the tolerance allows on this output
    ok: bool


# FP8 tensor-core products (torch._scaled_mm) accumulate with less than float32's precision on Hopper:
# a float32-output W8A8 GEMM (K = 576) erred 2.2e-4 of its output scale on an H100, against float32's
# 1e-4. Judged at 1e-3 of the scale: still far inside the e4m3 rounding of its inputs (~6e-2).
FP8_ACCUMULATION_RTOL = 1e-3


def _compare(name: str, shape: str, got: torch.Tensor, want: torch.Tensor, *, gemm: bool = False,
             rtol: float | None = None) -> Row:
    """allclose with the per-dtype tolerance (or `rtol`); GEMMs are judged against the output's scale."""
    atol, dtype_rtol = TOLERANCES[want.dtype]
    rtol = dtype_rtol if rtol is None else max(rtol, dtype_rtol)
    diff = (got.float() - want.float()).abs()
    if gemm:  # a dot over K errs with the outputs' scale, not each output's size (see tests/kernels/helpers)
        atol = rtol * (float(want.float().abs().max()) or 1.0)
    bound = atol + rtol * want.float().abs()
    ok = got.shape == want.shape and got.dtype == want.dtype and bool((diff <= bound).all())
    worst = float(diff.max()) if diff.numel() else 0.0
    return Row(name, str(want.dtype).removeprefix("torch."), shape, worst, float(bound.max()) if diff.numel() else atol,
               ok)


def _paged(s: Shapes, contexts: list[int], dtype: torch.dtype, device: str, gen: torch.Generator):
    per_seq = [-(-c // s.block_size) for c in contexts]
    num_blocks = sum(per_seq) + 4
    shape = (num_blocks, s.block_size, s.kv_heads, s.head_dim)
    kc = torch.randn(shape, generator=gen).to(dtype).to(device)
    vc = torch.randn(shape, generator=gen).to(dtype).to(device)
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(contexts), max(per_seq), dtype=torch.int32)
    used = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = order[used:used + n].to(torch.int32)
        used += n
    return kc, vc, tables.to(device)


def kernel_table(s: Shapes, device: str, dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32),
                 seed: int = 0) -> list[Row]:
    """Run every kernel and its reference on the same random inputs on `device`; one Row each."""
    k = {m: importlib.import_module(f"kernels.{m}") for m in (
        "rms_norm", "rotary", "rotary_kv", "silu_and_mul", "paged_attention", "prefill_attention", "lora_shrink",
        "lora_expand", "fp8_gemm", "awq_gemm", "awq_layout", "sample_full")}
    gen = torch.Generator().manual_seed(seed)
    return [row for dt in dtypes for row in _dtype_rows(s, device, dt, k, gen)] + [_sample_row(s, device, k, gen)]


def _sample_row(s: Shapes, device: str, k: dict, gen: torch.Generator) -> Row:
    """The whole-vocabulary draw (float32 logits whatever the model's dtype) against its reference over the
    same hashed noise: rows mixing temperature, top-p 0.9, top-k 50 and min-p. Judged by rows that drew a
    different token: up to 1 % may, where two scores agree to the rounding of each side's exp and log."""
    r, v = s.sample_rows, s.vocab
    logits = (torch.randn(r, v, generator=gen) * 3).to(device)
    temperature = (torch.rand(r, generator=gen) + 0.3).to(device)
    which = torch.arange(r) % 4
    top_k = torch.where(which == 2, 50, 0).to(device)
    top_p = torch.where(which == 1, 0.9, 1.0).to(device)
    min_p = torch.where(which == 3, 0.05, 0.0).to(device)
    seeds = torch.randint(0, 1 << 62, (r,), generator=gen).to(device)
    index = torch.randint(0, 1000, (r,), generator=gen).to(device)
    got = k["sample_full"].sample_full(logits, temperature, top_k, top_p, min_p, seeds, index)
    want = R.sample_full_ref(logits, temperature, top_k, top_p, min_p, seeded_noise(seeds, index, v))
    wrong = int((got != want).sum())
    return Row("sample_full (token ids)", "float32", f"{r}x{v}", float(wrong), float(r // 100), wrong <= r // 100)


def _dtype_rows(s: Shapes, device: str, dt: torch.dtype, k: dict, gen: torch.Generator) -> list[Row]:
    def rnd(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    rows: list[Row] = []

    def case(name: str, shape: str, run: Callable[[], torch.Tensor], ref: Callable[[], torch.Tensor],
             gemm: bool = False, rtol: float | None = None) -> None:
        rows.append(_compare(name, shape, run(), ref(), gemm=gemm, rtol=rtol))

    t, h, d = s.tokens, s.hidden, s.head_dim
    x, res, w = rnd(t, h, dtype=dt), rnd(t, h, dtype=dt), rnd(h, dtype=dt)
    case("rms_norm+residual", f"{t}x{h}", lambda: k["rms_norm"].rms_norm(x, w, 1e-5, res)[0],
         lambda: R.rms_norm_ref(x, w, 1e-5, res)[0])

    q, kk = rnd(t, s.heads, d, dtype=dt), rnd(t, s.kv_heads, d, dtype=dt)
    pos = torch.randint(0, 4 * t, (t,), generator=gen).to(device)
    freqs = torch.outer(torch.arange(4 * t).float(), 1.0 / 10000 ** (torch.arange(d // 2).float() / (d // 2)))
    cos, sin = freqs.cos().to(device), freqs.sin().to(device)
    case("rotary (q)", f"{t}x{s.heads}x{d}", lambda: k["rotary"].rotary_embedding(q, kk, pos, cos, sin)[0],
         lambda: R.rotary_embedding_ref(q, kk, pos, cos, sin)[0])

    # rotary + the KV-cache write in one launch (kernels/rotary_kv.py): q, and the caches it wrote, in the
    # model's dtype and in the FP8 layout (dequantized; judged against the scale as the attention rows are)
    qkv = rnd(t, (s.heads + 2 * s.kv_heads) * d, dtype=dt)
    slots = torch.randperm(2 * t, generator=gen)[:t].to(device)
    for fp8 in (False, True):
        blocks = -(-2 * t // s.block_size)
        caches = {}
        for impl in ("kernel", "reference"):
            shape = (blocks, s.block_size, s.kv_heads, d)
            kc = kv_fp8.allocate(*shape, device=device) if fp8 else torch.zeros(shape, dtype=dt, device=device)
            vc = kc.clone()
            fn = k["rotary_kv"].rotary_write_kv if impl == "kernel" else R.rotary_write_kv_ref
            caches[impl] = (fn(qkv, pos, cos, sin, kc, vc, slots, s.heads, s.kv_heads), kc, vc)
        got, want = caches["kernel"], caches["reference"]
        if not fp8:
            case("rotary_write_kv (q)", f"{t}x{s.heads}x{d}", lambda g=got: g[0], lambda w=want: w[0])
        for i, part in ((1, "k"), (2, "v")):
            case(f"rotary_write_kv ({part} cache{', fp8' if fp8 else ''})",
                 f"{t} slots x{s.kv_heads}x{d}", lambda g=got[i]: kv_fp8.readable(g, dt),
                 lambda w=want[i]: kv_fp8.readable(w, dt), gemm=fp8)

    gu = rnd(t, 2 * s.intermediate, dtype=dt)
    case("silu_and_mul", f"{t}x{2 * s.intermediate}", lambda: k["silu_and_mul"].silu_and_mul(gu),
         lambda: R.silu_and_mul_ref(gu))

    ctx = list(s.decode_contexts)
    kc, vc, tables = _paged(s, ctx, dt, device, gen)
    qd = rnd(len(ctx), s.heads, d, dtype=dt)
    lens = torch.tensor(ctx, dtype=torch.int32, device=device)
    case("paged_decode_attention", f"{len(ctx)} seqs, ctx<={max(ctx)}",
         lambda: k["paged_attention"].paged_decode_attention(qd, kc, vc, tables, lens, d**-0.5),
         lambda: R.paged_decode_attention_ref(qd, kc, vc, tables, lens, d**-0.5))
    # The FP8 KV cache (kernels/kv_fp8.py): the same caches quantized; judged against the output's scale,
    # as the kernels round the scaled probabilities to the dtype before their value dots.
    k8, v8 = kv_fp8.quantize(kc), kv_fp8.quantize(vc)
    case("paged_decode_attention (fp8 cache)", f"{len(ctx)} seqs, ctx<={max(ctx)}",
         lambda: k["paged_attention"].paged_decode_attention(qd, k8, v8, tables, lens, d**-0.5),
         lambda: R.paged_decode_attention_ref(qd, k8, v8, tables, lens, d**-0.5), gemm=True)

    q_lens, pctx = [c[0] for c in s.prefill_chunks], [c[1] for c in s.prefill_chunks]
    kc, vc, tables = _paged(s, pctx, dt, device, gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    qp = rnd(sum(q_lens), s.heads, d, dtype=dt)
    plens = torch.tensor(pctx, dtype=torch.int32, device=device)
    case("prefill_attention", f"chunks {q_lens} ctx {pctx}",
         lambda: k["prefill_attention"].prefill_attention(qp, kc, vc, tables, cu, plens, d**-0.5),
         lambda: R.prefill_attention_ref(qp, kc, vc, tables, cu, plens, d**-0.5))
    k8, v8 = kv_fp8.quantize(kc), kv_fp8.quantize(vc)
    case("prefill_attention (fp8 cache)", f"chunks {q_lens} ctx {pctx}",
         lambda: k["prefill_attention"].prefill_attention(qp, k8, v8, tables, cu, plens, d**-0.5),
         lambda: R.prefill_attention_ref(qp, k8, v8, tables, cu, plens, d**-0.5), gemm=True)

    lora_a = rnd(s.slots, s.rank, h, dtype=dt, scale=h**-0.5)
    lora_b = rnd(s.slots, h, s.rank, dtype=dt, scale=s.rank**-0.5)
    scaling = torch.linspace(0.5, 2.0, s.slots).to(device)
    ids = torch.randint(-1, s.slots, (t,), generator=gen).to(torch.int32).to(device)
    half = t // 2
    indptr = torch.tensor([0, half, half, t], dtype=torch.int32, device=device)  # one empty segment
    seg_ids = torch.tensor([0, 1, s.slots - 1], dtype=torch.int32, device=device)
    buf = R.bgmv_shrink_ref(x, lora_a, scaling, ids)
    case("bgmv_shrink", f"{t}x{h} r{s.rank}", lambda: k["lora_shrink"].bgmv_shrink(x, lora_a, scaling, ids),
         lambda: R.bgmv_shrink_ref(x, lora_a, scaling, ids))
    case("sgmv_shrink", f"{t}x{h} r{s.rank}",
         lambda: k["lora_shrink"].sgmv_shrink(x, lora_a, scaling, indptr, seg_ids),
         lambda: R.sgmv_shrink_ref(x, lora_a, scaling, indptr, seg_ids))
    case("bgmv_expand", f"{t}x{h} r{s.rank}",
         lambda: k["lora_expand"].bgmv_expand(res.clone(), buf, lora_b, ids),
         lambda: R.bgmv_expand_ref(res.clone(), buf, lora_b, ids))
    case("sgmv_expand", f"{t}x{h} r{s.rank}",
         lambda: k["lora_expand"].sgmv_expand(res.clone(), buf, lora_b, indptr, seg_ids),
         lambda: R.sgmv_expand_ref(res.clone(), buf, lora_b, indptr, seg_ids))

    w8, w8_scale = R.quantize_fp8_per_channel(torch.randn(s.intermediate, h, generator=gen))
    w8, w8_scale = w8.to(device), w8_scale.to(device)
    case("fp8_linear", f"{t}x{h} @ {s.intermediate}", lambda: k["fp8_gemm"].fp8_linear(x, w8, w8_scale),
         lambda: R.fp8_linear_ref(x, w8, w8_scale), gemm=True)
    if k["fp8_gemm"].w8a8_supported(device):
        case("fp8_w8a8_linear", f"{t}x{h} @ {s.intermediate}",
             lambda: k["fp8_gemm"].fp8_w8a8_linear(x, w8, w8_scale),
             lambda: R.fp8_w8a8_linear_ref(x, w8, w8_scale), gemm=True, rtol=FP8_ACCUMULATION_RTOL)

    qw, qz, sc = k["awq_layout"].awq_quantize(torch.randn(h, s.intermediate, generator=gen), s.awq_group)
    qw, qz, sc = qw.to(device), qz.to(device), sc.to(device)
    xa = rnd(t, s.intermediate, dtype=dt)
    case("awq_gemm", f"{t}x{s.intermediate} @ {h}", lambda: k["awq_gemm"].awq_gemm(xa, qw, qz, sc, s.awq_group),
         lambda: R.awq_gemm_ref(xa, qw, qz, sc, s.awq_group), gemm=True)
    return rows


def table_markdown(rows: list[Row]) -> str:
    lines = ["| kernel | dtype | shape | max abs err | allowed | ok |", "|---|---|---|---:|---:|---|"]
    lines += [f"| {r.kernel} | {r.dtype} | {r.shape} | {r.max_abs_err:.2e} | {r.allowed:.2e} | "
              f"{'yes' if r.ok else '**NO**'} |" for r in rows]
    return "\n".join(lines)
