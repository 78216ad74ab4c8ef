"""Runs every kernel benchmark in turn (a few seconds each on the CPU)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ["rms_norm", "rotary", "rotary_kv", "silu_and_mul", "paged_attention", "prefill_attention", "lora",
              "fp8_gemm", "awq_gemm", "cpu_decode", "cpu_sample", "sample_full"]


def main(argv: list[str]) -> int:
    chosen = argv or BENCHMARKS
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    for name in chosen:
        importlib.import_module(f"benchmarks.kernels.bench_{name}").main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
