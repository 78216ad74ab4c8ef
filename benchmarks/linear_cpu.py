"""Dense projections on the CPU: float32 through MKL (`F.linear`), float32 through oneDNN's prepacked
weight (what `dataplane.models.layers.Linear` does for float32), float32 maths on FBGEMM's float16
packed weight (`Linear(w, storage=torch.float16)`, what weight_dtype='auto' picks on AVX2 CPUs), and
bf16 `F.linear`; then whole engine steps.

    python -m benchmarks.linear_cpu [--repeats 5]

1. One decode step's linears at SmolLM2-135M's shapes (30 layers of fused qkv, o, fused gate_up,
   down, and the lm head), each weight its own tensor so they stream from memory as in the model,
   at M = 1, 4 and 32 rows. Reports ms per sweep and the weight bytes streamed per second.
2. The engine's median decode step at batch 1 and 32 (real model, `--threads`), in subprocesses:
   float32 maths on float16 weights, float32 with packing, float32 with TESSERA_ONEDNN_LINEAR=0,
   and bf16.

Writes benchmarks/results/linear_cpu.json and .md. The ratios depend on the CPU: record it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import environment, run_child, write_results
from dataplane import SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.core import EngineCore
from dataplane.models.layers import Linear
from dataplane.quant import DenseLinear

LAYERS = 30
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of qkv, o, gate_up, down
VOCAB = 49152
ROWS = (1, 4, 32)

def engine_steps(dtype: str, weight_dtype: str, threads: int) -> dict[int, float]:
    """The engine's median decode step (ms) at batch 1 and 32; run in a process of its own (run_child),
    so that its threads and TESSERA_ONEDNN_LINEAR are its own."""
    torch.set_num_threads(threads)
    core = EngineCore(ModelConfig("smollm2-135m-instruct", dtype=dtype, weight_dtype=weight_dtype),
                      CacheConfig(kv_cache_memory="512MiB"),
                      SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=512), progress=False)
    out = {}
    for bs in (1, 32):
        params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
        for i in range(bs):
            core.add(*core.make_requests(list(range(100 + i, 228 + i)), params))
        steps = []
        while core.has_unfinished():
            t0 = time.perf_counter()
            outs = core.step(delta=True)
            dt = time.perf_counter() - t0
            if all(len(c.token_ids) == 1 for o in outs for c in o.outputs) and len(outs) == bs:
                steps.append(dt)  # decode steps only: every request got exactly one token
        out[bs] = statistics.median(steps) * 1e3
    return out


# label, dtype, weight_dtype, environment
ENGINE_CONFIGS = [("float32 maths, float16 weights (FBGEMM)", "float32", "float16", {}),
                  ("float32, oneDNN prepacked", "float32", "float32", {}),
                  ("float32, F.linear (TESSERA_ONEDNN_LINEAR=0)", "float32", "float32", {"TESSERA_ONEDNN_LINEAR": "0"}),
                  ("bfloat16", "bfloat16", "bfloat16", {})]
FP16 = "float32 maths, float16 FBGEMM"


def sweep_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(o, i, generator=g) / i**0.5 for _ in range(LAYERS) for o, i in SHAPES]
    ws.append(torch.randn(VOCAB, 576, generator=g) / 24)
    return [w.to(dtype) for w in ws]


def time_sweep(fns: list, inputs: dict[int, torch.Tensor], repeats: int) -> float:
    for fn in fns[:8]:
        fn(inputs[fn.in_features])  # warm the code paths
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for fn in fns:
            fn(inputs[fn.in_features])
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine-rounds", type=int, default=3, help="0 skips the engine steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="linear_cpu", help="results file name (benchmarks/results/<name>.json/.md)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fp32 = sweep_weights(torch.float32)
    fp32_bytes = sum(w.numel() * 4 for w in fp32)
    # DenseLinear is plain F.linear whatever the dtype (MKL for float32); Linear prepacks float32.
    variants = {"float32 F.linear (MKL)": [DenseLinear(w) for w in fp32],
                "float32 oneDNN prepacked": [Linear(w) for w in fp32],
                FP16: [Linear(w, storage=torch.float16) for w in fp32],
                "bfloat16 F.linear": [DenseLinear(w.bfloat16()) for w in fp32]}
    assert all(v.packed for v in variants["float32 oneDNN prepacked"]), "oneDNN packing unavailable here"
    assert all(v.storage_dtype is torch.float16 for v in variants[FP16]), "FBGEMM fp16 unavailable here"
    del fp32
    sweep = []
    with torch.inference_mode():
        for name, fns in variants.items():
            for m in ROWS:
                inputs = {k: torch.randn(m, k).to(torch.bfloat16 if "bfloat16" in name else torch.float32)
                          for k in (576, 1536)}
                s = time_sweep(fns, inputs, args.repeats)
                nbytes = fp32_bytes // (2 if "bfloat16" in name or "float16" in name else 1)
                sweep.append({"variant": name, "rows": m, "ms": s * 1e3, "weight_gb_s": nbytes / s / 1e9})
                print(f"{name:28s} M={m:2d} {s * 1e3:8.1f} ms  {nbytes / s / 1e9:5.1f} GB/s", flush=True)

    engine: dict[str, dict[int, float]] = {}
    if args.engine_rounds:
        # Interleaved rounds, median per configuration: single runs on a shared host moved by 20%.
        runs: dict[str, list[dict[int, float]]] = {}
        for r in range(args.engine_rounds):
            for label, dtype, weight_dtype, env in ENGINE_CONFIGS:
                if dtype == "bfloat16" and r > 0:
                    continue  # one bf16 run: it is several times slower, and only a reference
                res = run_child("benchmarks.linear_cpu:engine_steps", env=env, dtype=dtype,
                                weight_dtype=weight_dtype, threads=args.threads)
                got = {int(k): v for k, v in res.items()}
                runs.setdefault(label, []).append(got)
                print(f"round {r}: {label} {got}", flush=True)
        engine = {label: {bs: statistics.median(x[bs] for x in xs) for bs in (1, 32)} for label, xs in runs.items()}

    ref = {r["rows"]: r["ms"] for r in sweep if r["variant"] == "float32 F.linear (MKL)"}
    table = ["# Dense projections on the CPU (`python -m benchmarks.linear_cpu`)", "",
             f"One decode step's linears of SmolLM2-135M ({LAYERS} layers x qkv, o, gate_up, down + lm head; "
             f"{fp32_bytes / 2**20:.0f} MiB in float32), best of {args.repeats}, {args.threads} thread(s).", "",
             "| variant | rows | ms per step's linears | weight GB/s | vs float32 F.linear |", "|---|---:|---:|---:|---:|"]
    for r in sweep:
        table.append(f"| {r['variant']} | {r['rows']} | {r['ms']:.1f} | {r['weight_gb_s']:.1f} | "
                     f"{ref[r['rows']] / r['ms']:.2f}x |")
    if engine:
        table += ["", f"Engine, median decode step (real model, 128-token prompts, {args.threads} thread(s); median of "
                  f"{args.engine_rounds} interleaved runs, bf16 one run):", "",
                  "| engine | batch 1 ms | batch 32 ms | batch 32 tok/s |", "|---|---:|---:|---:|"]
        for label, v in engine.items():
            table.append(f"| {label} | {v[1]:.1f} | {v[32]:.1f} | {32e3 / v[32]:.0f} |")
    env = environment()
    table += ["", f"Environment: {env}."]
    jpath, mpath = write_results(args.name, {"env": env, "threads": args.threads, "sweep": sweep,
                                             "engine_step_ms": engine},
                                 "\n".join(table))
    print("\n".join(table))
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
