"""Batch-1 decode latency without speculation: what each CPU path buys, and llama.cpp on the same GGUF
in the same run.

    python -m benchmarks.decode_latency [--rounds 5] [--threads N] [--compile] [--no-peer]
                                        [--quant int8,int4] [--legacy-bf16]

Every variant decodes 64 greedy tokens after the same 128-token prompt, alone on its engine
(max_num_seqs=1), in interleaved rounds; the table gives the median. The model runs in
`dtype="auto"`, as a worker does: bf16 where the CPU multiplies it natively, float32 with
float16-stored projections on an AVX2-only CPU. Variants:

- the torch path (every op a torch op: the engine before the C++ decode ops);
- the default (kernels/cpu_decode.py: decode attention, rotary + KV write, float32 RMSNorm);
- `quantization="gguf"`: the GGUF's own Q4_1 projections and Q8_0 head through kernels/gguf_cpu.py
  (the file's weights, 8-bit activation blocks; passes the quality gate, +0.24% perplexity), with
  decode-only steps as one C++ call (models/fused_decode.py, the default) and one op at a time;
- 32 concurrent requests for the torch path, the default, gguf (fused) and gguf with a dense copy above 8
  rows (aggregate tok/s: the batch-1 work must not cost throughput);
- with --compile, the default with the decode step compiled (models/compiled_decode.py); with
  --quant, round-to-nearest int8 / int4 at load (not gated); with --legacy-bf16 on a native-bf16
  CPU, bf16 projections as plain `F.linear` (before the oneDNN prepacking).

The peer is llama-cpp-python (the `bench` extra), same GGUF (its Q4_1 weights), same thread
count, same prompt ids. A torch.profiler pass over 20 batch-1 steps of the gguf variant splits
the step into op categories (the C++ ops and kernels count as Python there: they are not torch ops).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.common import environment, fmt, measure_bandwidth_gbs, write_results
from dataplane import SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.core import EngineCore
from dataplane.models.loader import load_configured
from dataplane.models.registry import resolve_model_path

MODEL = "smollm2-135m-instruct"
PROMPT_LEN, NEW_TOKENS = 128, 64

# torch.profiler op names -> the step's parts (self CPU time; anything unnamed is "other ops").
CATEGORIES = {
    "projections (incl. lm head)": ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear",
                                    "quantized::linear_dynamic_fp16",
                                    "tessera::projection"),
    "attention (gather, scores, softmax, KV write)": (
        "aten::bmm", "aten::_softmax", "aten::softmax", "aten::index_select", "aten::masked_fill_",
        "aten::index_copy_", "aten::stack", "aten::new_zeros", "aten::zero_", "aten::fill_",
        "tessera::paged_attention"),
    "norms": ("aten::_fused_rms_norm", "aten::rms_norm", "aten::pow", "aten::mean", "aten::rsqrt"),
    "copies, casts, views": ("aten::copy_", "aten::_to_copy", "aten::to", "aten::view", "aten::select",
                             "aten::slice", "aten::as_strided", "aten::reshape", "aten::transpose", "aten::t",
                             "aten::empty", "aten::empty_strided", "aten::view_as_complex", "aten::view_as_real",
                             "aten::unsqueeze", "aten::flatten", "aten::expand", "aten::contiguous",
                             "aten::clone", "aten::_unsafe_view", "aten::chunk", "aten::split", "aten::lift_fresh"),
    "pointwise (residual, rotary, SwiGLU)": ("aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::silu",
                                            "aten::div_", "aten::cat", "aten::sum", "aten::embedding"),
    "sampling": ("aten::argmax", "aten::max", "aten::index", "aten::index_put_", "aten::_local_scalar_dense",
                 "aten::item", "aten::lt", "aten::arange", "aten::scalar_tensor"),
}


def _engine(loaded, mc: ModelConfig, seqs: int) -> EngineCore:
    return EngineCore(mc, CacheConfig(kv_cache_memory="1GiB"), SchedulerConfig(max_num_seqs=seqs),
                      progress=False, preloaded=loaded)


def _prompt(i: int) -> list[int]:
    return [(37 * i + 11 * j) % 20000 + 200 for j in range(PROMPT_LEN)]


def _decode(core: EngineCore, concurrency: int) -> tuple[float, float]:
    """(wall tok/s, process-CPU tok/s) of the decode steps after every prompt is in."""
    for i in range(concurrency):
        rid, text, ch = core.make_requests(_prompt(i), SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                                      ignore_eos=True))
        core.add(rid, text, ch)
    first = 0
    while core.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                                         for r in core.scheduler.running):
        first += sum(len(c.token_ids) for o in core.step(delta=True) for c in o.outputs)
    wall, cpu, tokens = time.perf_counter(), time.process_time(), 0
    while core.has_unfinished():
        tokens += sum(len(c.token_ids) for o in core.step(delta=True) for c in o.outputs)
    return tokens / (time.perf_counter() - wall), tokens / (time.process_time() - cpu)


def _profile(core: EngineCore) -> dict[str, float]:
    """ms per batch-1 decode step, by category, over 20 profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    rid, text, ch = core.make_requests(_prompt(0), SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    core.add(rid, text, ch)
    for _ in range(6):
        core.step()
    steps = 20
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            core.step()
        wall = time.perf_counter() - t0
    while core.has_unfinished():
        core.step()
    owner = {name: cat for cat, names in CATEGORIES.items() for name in names}
    parts: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        parts[owner.get(e.key, "other ops")] += e.self_cpu_time_total / 1e3 / steps
    ops = sum(parts.values())
    parts["Python and C++ kernels: scheduler, runner input prep, glue, gguf matmuls, decode ops (wall - torch ops)"] = max(wall * 1e3 / steps - ops, 0.0)
    parts["step wall under the profiler"] = wall * 1e3 / steps
    return dict(parts)


def _llama_cpp(threads: int, rounds: int) -> list[float] | str:
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        return f"llama-cpp-python not installed ({exc}); pip install -e '.[bench]'"
    llm = Llama(model_path=str(resolve_model_path(MODEL)), n_ctx=1024, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    out = []
    for r in range(rounds + 1):
        n, t_first = 0, 0.0
        for _tok in llm.generate(_prompt(0), top_k=1, temp=0.0, reset=True):
            n += 1
            if n == 1:
                t_first = time.perf_counter()  # the prompt is in and the first token out
            if n == NEW_TOKENS + 1:
                break
        if r:  # the first round warms up
            out.append(NEW_TOKENS / (time.perf_counter() - t_first))
    return out


def _load(mc: ModelConfig, cpu_ops: bool = True):
    loaded = load_configured(mc, progress=False)
    loaded.model.use_cpu_ops(cpu_ops and loaded.model.cpu_ops)
    return loaded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch and llama.cpp threads (default: torch's)")
    ap.add_argument("--compile", action="store_true", help="also the compiled decode step (compiles first)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--quant", default="", help="also these batch-1 variants quantized at load, lm head included "
                    "(comma-separated: int8, int4): what fewer bytes buy, not gated variants")
    ap.add_argument("--legacy-bf16", action="store_true", help="also bf16 with plain F.linear projections")
    ap.add_argument("--name", default="decode_latency")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    bandwidth = measure_bandwidth_gbs()
    mc = ModelConfig(MODEL, dtype="auto")
    default = _load(mc)
    torch_ops = _load(mc, cpu_ops=False)
    gmc = ModelConfig(MODEL, dtype="auto", quantization="gguf")
    gguf = _load(gmc)
    gguf_ops = _load(gmc)
    gguf_ops.model.fused = None  # the same kernels one projection / op at a time
    gguf_dense = _load(ModelConfig(MODEL, dtype="auto", quantization="gguf", int4_dense_above=8))
    # Weights streamed per token at batch 1: every projection and the head once (the head is the
    # embedding, counted once however many copies are kept).
    def streamed(model) -> int:
        head = model.lm_head.weight_bytes
        return sum(p.weight_bytes for layer in model.layers
                   for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)) + head
    default_bytes, gguf_bytes = streamed(default.model), streamed(gguf.model)
    label = mc.dtype_label
    variants = {f"{label}, torch ops": (torch_ops, 1),
                f"{label}, C++ decode ops (default)": (default, 1),
                "gguf Q4_1/Q8_0 blocks, C++ kernels one op at a time": (gguf_ops, 1),
                "gguf Q4_1/Q8_0 blocks, fused decode step (default)": (gguf, 1),
                f"{label}, torch ops, 32 concurrent": (torch_ops, 32),
                f"{label}, C++ decode ops (default), 32 concurrent": (default, 32),
                "gguf Q4_1/Q8_0 blocks, fused decode step, 32 concurrent": (gguf, 32),
                "gguf blocks + dense copy above 8 rows, 32 concurrent": (gguf_dense, 32)}
    if args.legacy_bf16 and mc.torch_dtype == torch.bfloat16:
        os.environ["TESSERA_ONEDNN_LINEAR"] = "0"
        variants["bf16, plain F.linear"] = (_load(mc), 1)
        os.environ["TESSERA_ONEDNN_LINEAR"] = "1"
    for method in filter(None, args.quant.split(",")):
        qmc = ModelConfig(MODEL, dtype="auto", quantization=method, quantize_lm_head=True)
        variants[f"{method} weights and lm head (at load, round-to-nearest, not gated)"] = (_load(qmc), 1)
    compile_s = None
    if args.compile:
        compiled = _load(mc)
        compiled.model.enable_compiled_decode()
        variants["default + compiled decode"] = (compiled, 1)
        variants["default + compiled decode, 32 concurrent"] = (compiled, 32)
        _decode(_engine(compiled, mc, 1), 1)  # compiles the batch-1 graph
        _decode(_engine(compiled, mc, 32), 32)  # ... and the dynamic one
        compile_s = {n: round(t, 1) for n, t in compiled.model.compiled.compile_seconds.items()}
        print(f"compile seconds by first batch size: {compile_s}; failed: {compiled.model.compiled.failed}")
    engines = {name: _engine(m, mc, c) for name, (m, c) in variants.items()}
    for name, (_m, c) in variants.items():
        _decode(engines[name], c)  # warm-up: first pass over each shape
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    load = []
    for r in range(args.rounds):
        load.append(os.getloadavg()[0])
        for name, (_m, c) in variants.items():
            w, p = _decode(engines[name], c)
            wall[name].append(w)
            cpu[name].append(p)
        print(f"round {r}: " + ", ".join(f"{n}: {wall[n][-1]:.1f}" for n in variants), flush=True)
    peer = None if args.no_peer else _llama_cpp(threads, args.rounds)
    breakdown = _profile(_engine(gguf, gmc, 1))
    med = {n: statistics.median(v) for n, v in wall.items()}
    base1, base32 = med[f"{label}, torch ops"], med[f"{label}, torch ops, 32 concurrent"]
    p = statistics.median(peer) if isinstance(peer, list) else None
    roofline = {n: bandwidth * 1e9 / (gguf_bytes if n.startswith("gguf") else default_bytes) for n in variants}
    results = {"env": environment(), "threads": threads, "bandwidth_gbs": bandwidth, "dtype": label,
               "streamed_bytes": {"default": default_bytes, "gguf": gguf_bytes}, "load_1min": load,
               "wall_tok_s": wall, "cpu_tok_s": cpu, "llama_cpp_tok_s": peer, "compile_seconds": compile_s,
               "breakdown_ms": breakdown}
    rows = ["| system | tok/s (median) | per token (ms) | vs torch ops | vs llama.cpp | CPU-time tok/s | "
            "share of its roofline |", "|---|---:|---:|---:|---:|---:|---:|"]
    for n in variants:
        conc = "32 concurrent" in n
        rows.append(f"| tessera, {n} | {fmt(med[n])} | {fmt(1e3 / med[n] * (32 if conc else 1), 2)} | "
                    f"{med[n] / (base32 if conc else base1):.2f}x | "
                    f"{'–' if conc or p is None else f'{med[n] / p:.2f}x'} | {fmt(statistics.median(cpu[n]))} | "
                    f"{'–' if conc else f'{med[n] / roofline[n]:.0%}'} |")
    if p is not None:
        rows.append(f"| llama.cpp (llama-cpp-python), same GGUF (Q4_1 weights), batch 1 | {fmt(p)} | "
                    f"{fmt(1e3 / p, 2)} | {p / base1:.2f}x | 1.00x | – | – |")
        results["gguf_vs_llama_cpp"] = med["gguf Q4_1/Q8_0 blocks, fused decode step (default)"] / p
    else:
        rows.append(f"| llama.cpp | not run: {peer or '--no-peer'} | | | | | |")
    rows += ["", "Batch-1 step breakdown, gguf blocks with the fused step (torch.profiler self CPU time, 20 "
             "steps; the profiler inflates small ops, and the C++ kernels are not torch ops so they fall in the "
             "first line):", "",
             "| part | ms per step |", "|---|---:|"]
    rows += [f"| {k} | {v:.2f} |" for k, v in sorted(breakdown.items(), key=lambda kv: -kv[1])]
    loads = f"{min(load):.1f}–{max(load):.1f}"
    rows += ["", f"SmolLM2-135M-Instruct, {results['env']['cpu']} ({results['env']['cpu_capability']}"
             f"{', native bf16' if results['env']['native_bf16'] else ''}), {threads} thread(s), dtype auto = {label}, "
             f"load average {loads}, {args.rounds} interleaved rounds of {NEW_TOKENS} greedy tokens after a "
             f"{PROMPT_LEN}-token prompt (32 concurrent: aggregate tok/s, per token = 32 / tok/s). Rooflines: "
             f"{bandwidth:.1f} GB/s measured / bytes streamed per token ({default_bytes / 1e6:.0f} MB dense, "
             f"{gguf_bytes / 1e6:.0f} MB gguf) = {bandwidth * 1e9 / default_bytes:.0f} / "
             f"{bandwidth * 1e9 / gguf_bytes:.0f} tok/s."
             + (f" Compile seconds (first step of each batch size): {compile_s}." if compile_s else "")]
    table = "\n".join(rows)
    print(table)
    write_results(args.name, results, table)


if __name__ == "__main__":
    main()
