"""Quantized linear layers against dense bf16 on SmolLM2-135M's shapes, batch 1 and batch 32.

    python -m benchmarks.quant_layers [--budget SECONDS]

Times each layer's forward (TESSERA_BENCH_THREADS threads, default 1: see benchmarks/kernels/
_harness.py) and reports resident weight bytes. The last rows add up one decode step's linears
(30 layers of fused qkv, o, fused gate_up, down, plus the lm head): the upper bound on what
quantized weights can do for decode here, before attention and Python overheads.
Writes benchmarks/results/quant_layers.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch

from benchmarks.common import environment
from benchmarks.kernels._harness import BENCH_THREADS, time_us
from dataplane.quant import DenseLinear, Fp8Linear, Int4Linear, Int8Linear, LinearLayer

RESULTS = os.path.join(os.path.dirname(__file__), "results")
LAYERS = 30
# (name, in, out, uses per decode step)
SHAPES = [
    ("o_proj 576->576", 576, 576, LAYERS),
    ("k/v 576->192", 576, 192, 0),
    ("up 576->1536", 576, 1536, 0),
    ("down 1536->576", 1536, 576, LAYERS),
    ("qkv fused 576->960", 576, 960, LAYERS),
    ("gate_up fused 576->3072", 576, 3072, LAYERS),
    ("lm_head 576->49152", 576, 49152, 1),
]
VARIANTS: dict[str, Callable[[torch.Tensor], LinearLayer]] = {
    "bf16 dense": lambda w: DenseLinear(w.bfloat16()),
    "int4 g64": lambda w: Int4Linear.from_float(w, 64),
    "int4 g32": lambda w: Int4Linear.from_float(w, 32),
    "int8": lambda w: Int8Linear.from_float(w),
    "fp8 (decoded at load)": lambda w: Fp8Linear.from_float(w, cpu_mode="dequantized"),
    "fp8 (per call)": lambda w: Fp8Linear.from_float(w, cpu_mode="per_call"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=0.15, help="seconds of timing per measurement")
    args = parser.parse_args()
    torch.set_num_threads(BENCH_THREADS)
    rows = []
    for name, k, n, uses in SHAPES:
        weight = torch.randn(n, k, generator=torch.Generator().manual_seed(k + n)) / k**0.5
        for variant, build in VARIANTS.items():
            if variant == "fp8 (per call)" and n > 4096:
                continue  # ~20 ms per call on the lm head: not a contender, not worth the wait
            layer = build(weight)
            row = {"shape": name, "in": k, "out": n, "uses_per_step": uses, "variant": variant,
                   "weight_bytes": layer.weight_bytes}
            for m in (1, 32):
                x = torch.randn(m, k).bfloat16()
                row[f"us_m{m}"] = round(time_us(lambda x=x, layer=layer: layer(x), budget_s=args.budget), 1)
            rows.append(row)
            print(f"{name:<26} {variant:<22} M=1 {row['us_m1']:9.1f} us  M=32 {row['us_m32']:9.1f} us  "
                  f"{row['weight_bytes'] / 2**20:7.2f} MiB")
    totals = _decode_step_totals(rows)
    env = {**environment(), "load_average_1m": os.getloadavg()[0]}  # threads: BENCH_THREADS, set above
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "quant_layers.json"), "w") as f:
        json.dump({"environment": env, "rows": rows, "decode_step_linears": totals}, f, indent=2)
        f.write("\n")
    with open(os.path.join(RESULTS, "quant_layers.md"), "w") as f:
        f.write(_markdown(rows, totals, env))
    print("wrote benchmarks/results/quant_layers.json and .md")


def _decode_step_totals(rows: list[dict]) -> dict[str, dict]:
    """Sum of uses x time over the shapes one decode step runs, per variant that has them all."""
    totals: dict[str, dict] = {}
    needed = {name for name, _, _, uses in SHAPES if uses}
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant and r["uses_per_step"]]
        if {r["shape"] for r in mine} != needed:
            continue
        totals[variant] = {
            f"us_m{m}": round(sum(r[f"us_m{m}"] * r["uses_per_step"] for r in mine), 1) for m in (1, 32)
        } | {"weight_mib": round(sum(r["weight_bytes"] * r["uses_per_step"] for r in mine) / 2**20, 1)}
    return totals


def _markdown(rows: list[dict], totals: dict[str, dict], env: dict) -> str:
    dense = {r["shape"]: r for r in rows if r["variant"] == "bf16 dense"}
    out = [f"# Quantized linear layers vs bf16 (torch {env['torch']}, {env['threads']} thread(s), {env['when']}, "
           f"load {env['load_average_1m']:.1f})", "",
           "| shape | variant | M=1 µs | vs bf16 | M=32 µs | vs bf16 | weight MiB |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = dense[r["shape"]]
        out.append(f"| {r['shape']} | {r['variant']} | {r['us_m1']:.1f} | {d['us_m1'] / r['us_m1']:.2f}× | "
                   f"{r['us_m32']:.1f} | {d['us_m32'] / r['us_m32']:.2f}× | {r['weight_bytes'] / 2**20:.2f} |")
    base = totals.get("bf16 dense")
    out += ["", "One decode step's linears (30 × (qkv, o, gate_up, down) + lm head):", "",
            "| variant | M=1 ms | vs bf16 | M=32 ms | vs bf16 | weight MiB |", "|---|---:|---:|---:|---:|---:|"]
    for variant, t in totals.items():
        out.append(f"| {variant} | {t['us_m1'] / 1000:.2f} | {base['us_m1'] / t['us_m1']:.2f}× | "
                   f"{t['us_m32'] / 1000:.2f} | {base['us_m32'] / t['us_m32']:.2f}× | {t['weight_mib']:.1f} |")
    out += ["", "Speed-ups above 1 are faster than bf16. Times are the best of 7 batches (shared machine)."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
