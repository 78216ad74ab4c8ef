"""What a busy neighbour process does to the engine's decode on a small host: the lead for the real
stack's flood (issue: a free-tier flood costs a premium tenant 8x its TTFT through `make run`).

    python -m benchmarks.cpu_contention [--runs 5] [--tokens 32]

SmolLM2-135M (bf16 where native, else as `auto` picks), batch 1, greedy, `LLM.generate`, median of
`--runs`, under three neighbours: none, one process spinning a core at `nice 10` (the issue's flood
client), one spinning at `nice 0` (what an un-niced gateway busy with a flood, or any other process,
is to the worker). Each engine setting runs in its own child process, because libgomp reads its
environment once: torch's default threads (the cores) with libgomp's default (active) wait, the
same with OMP_WAIT_POLICY=PASSIVE, and one thread.

Why it matters: with as many OpenMP threads as cores, a step's barriers wait on a thread the kernel
has just given to the neighbour; libgomp then throttles. On a 2-core host that multiplies the step,
which a gateway-only benchmark with a fake worker (benchmarks.gateway) cannot see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # name: (torch threads or None for torch's default, extra environment)
    "default threads, active wait": (None, {}),
    "default threads, OMP_WAIT_POLICY=PASSIVE": (None, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1 thread": (1, {}),
}
NEIGHBOURS = (("none", None), ("spinner at nice 10", 10), ("spinner at nice 0", 0))
PROMPT = "Write a short story about a robot who learns to paint."


def _child(threads: int | None, runs: int, tokens: int) -> dict:
    import torch

    from dataplane import LLM, SamplingParams

    if threads is not None:
        torch.set_num_threads(threads)
    llm = LLM("smollm2-135m-instruct", dtype="auto")
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    def median_ms() -> float:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            llm.generate([PROMPT], params)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    median_ms()  # warm
    out = {"threads": torch.get_num_threads()}
    for name, nice in NEIGHBOURS:
        spinner = None
        if nice is not None:
            spinner = subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            out[name] = median_ms()
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        threads = None if args.child == "default" else int(args.child)
        print(json.dumps(_child(threads, args.runs, args.tokens)))
        return

    from benchmarks.common import _cpu_name, write_results

    results = {}
    for name, (threads, extra) in SETTINGS.items():
        env = {**os.environ, **extra}
        done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_contention", "--child",
                               "default" if threads is None else str(threads), "--runs", str(args.runs),
                               "--tokens", str(args.tokens)],
                              cwd=ROOT, env=env, check=True, capture_output=True, text=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(name, results[name], flush=True)
    cpu, when = _cpu_name(), time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# Decode beside a busy neighbour process ({cpu}, {os.cpu_count()} cores, {when})", "",
             f"`python -m benchmarks.cpu_contention --runs {args.runs} --tokens {args.tokens}`: SmolLM2-135M, "
             f"batch 1, {args.tokens} greedy tokens, `LLM.generate`, median ms (× alone).", "",
             "| engine | threads | alone | spinner at nice 10 | spinner at nice 0 |", "|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        alone = r["none"]
        cells = [f"{alone:.0f}"] + [f"{r[n]:.0f} ({r[n] / alone:.2f}×)" for n, _ in NEIGHBOURS[1:]]
        lines.append(f"| {name} | {r['threads']} | " + " | ".join(cells) + " |")
    write_results("cpu_contention", {"cpu": cpu, "cores": os.cpu_count(), "when": when, "runs": args.runs,
                                     "tokens": args.tokens, "results": results}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
