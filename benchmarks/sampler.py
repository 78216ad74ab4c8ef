"""The sampler's cost per step at a real vocabulary, against another commit in the same run.

    python -m benchmarks.sampler [--batches 1,8,32] [--vocab 49152] [--rounds 3] [--baseline REV]

`Sampler.sample_tensor` on float32 logits [batch, vocab] (SmolLM2's 49,152 tokens by default, shaped
like a model's: a few likely tokens over a long tail), one thread, half the rows seeded, in the
sampling parameters OpenAI-style clients send:

- `temperature`: temperature 1, nothing else (the API's defaults);
- `top_p`: temperature 0.7, top-p 0.9 (no top-k: the whole vocabulary is drawn from);
- `flat top_p`: the same over nearly flat logits, whose nucleus is most of the vocabulary;
- `top_k + top_p`: temperature 0.8, top-k 40, top-p 0.95 (the draw among top-k candidates).

Each call gets new logits (a model's change every step; a benchmark's repeated ones would let the
branch predictor learn them). `--engine` adds what it comes to in a real decode: SmolLM2-135M through
`LLM.generate` (1 thread, dtype auto), 8 requests of 64 tokens, greedy against temperature 0.7
with top-p 0.9 (`ignore_eos`), tokens a second of the whole call. `--baseline REV` runs the same in a worktree of REV (as
benchmarks.step_overhead does), rounds interleaved, and reports the ratio: only same-run ratios compare.
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
WORKLOADS = ("temperature", "top_p", "flat top_p", "top_k + top_p")


def _batch(workload: str, rows: int):  # noqa: ANN202 - a SamplingBatch of whichever commit runs this
    import numpy as np

    from dataplane.sampling.sampler import SamplingBatch

    temperature = {"temperature": 1.0, "top_p": 0.7, "flat top_p": 0.7, "top_k + top_p": 0.8}[workload]
    b = SamplingBatch(np.full(rows, temperature, dtype=np.float32))
    if workload != "temperature":
        b.top_p = np.full(rows, 0.95 if workload == "top_k + top_p" else 0.9, dtype=np.float32)
    if workload == "top_k + top_p":
        b.top_k = np.full(rows, 40, dtype=np.int64)
    b.seeds = np.where(np.arange(rows) % 2 == 0, np.arange(rows) * 7 + 1, -1).astype(np.int64)
    b.output_index = np.arange(rows, dtype=np.int64)
    return b


def _logits(rows: int, vocab: int, flat: bool, gen):  # noqa: ANN001, ANN202
    import torch

    if flat:
        return torch.randn(rows, vocab, generator=gen) * 0.3
    # a model's shape: a long tail (Gumbel-ish, scale 1.5) and a few tokens well above it
    logits = torch.randn(rows, vocab, generator=gen) * 1.5
    top = torch.randint(0, vocab, (rows, 8), generator=gen)
    return logits.scatter_add_(1, top, torch.rand(rows, 8, generator=gen) * 6 + 6)


def measure(batches: list[int], vocab: int, calls: int) -> dict[str, dict[str, float]]:
    """{workload: {batch: median ms a call}} in this process (its commit's sampler)."""
    import torch

    from dataplane.sampling.sampler import Sampler

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler(seed=0)
    out: dict[str, dict[str, float]] = {}
    for workload in WORKLOADS:
        for rows in batches:
            inputs = [_logits(rows, vocab, workload == "flat top_p", gen) for _ in range(calls + 1)]
            times = []
            for i, logits in enumerate(inputs):
                batch = _batch(workload, rows)
                t0 = time.perf_counter()
                sampler.sample_tensor(logits, batch)
                if i:  # the first call warms up
                    times.append(time.perf_counter() - t0)
            out.setdefault(workload, {})[str(rows)] = statistics.median(times) * 1e3
    return out


def measure_engine(requests: int = 8, tokens: int = 64) -> dict[str, dict[str, float]]:
    """{"engine": {"greedy": tok/s, "top_p": tok/s}} of SmolLM2 decoding `requests` together."""
    from dataplane import LLM, SamplingParams

    llm = LLM("smollm2-135m-instruct", dtype="auto", max_num_seqs=requests)
    prompts = [f"Write a short story about a {animal}." for animal in
               ("cat", "dog", "fox", "owl", "bee", "eel", "yak", "ant", "elk", "emu")[:requests]] * (
                   1 + requests // 10)
    prompts = prompts[:requests]
    out = {}
    for name, params in (("greedy", SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)),
                         ("top_p", SamplingParams(max_tokens=tokens, temperature=0.7, top_p=0.9, ignore_eos=True))):
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=params.temperature, top_p=params.top_p))
        t0 = time.perf_counter()
        done = llm.generate(prompts, params)
        elapsed = time.perf_counter() - t0
        out[name] = sum(len(r.outputs[0].token_ids) for r in done) / elapsed
    return {"engine": out}


def _child(tree: Path, batches: list[int], vocab: int, calls: int, engine: bool = False) -> dict[str, dict[str, float]]:
    """`measure` in a fresh process importing the sampler from `tree` (this file's code runs there)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--batches",
                          ",".join(map(str, batches)), "--vocab", str(vocab), "--calls", str(calls)]
                         + (["--engine"] if engine else []),
                         cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--calls", type=int, default=6, help="timed calls per workload and batch (median)")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many runs of each tree, interleaved")
    ap.add_argument("--baseline", default=None, help="a git revision to measure in the same run")
    ap.add_argument("--engine", action="store_true", help="also SmolLM2's decode, greedy against top-p")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if a.child:
        print(json.dumps(measure_engine() if a.engine else measure(batches, a.vocab, a.calls)))
        return

    from benchmarks.common import environment, write_results
    from benchmarks.step_overhead import _baseline_tree

    trees = {"this tree": ROOT}
    if a.baseline:
        trees[f"baseline {a.baseline}"] = _baseline_tree(a.baseline)
    best: dict[str, dict[str, dict[str, float]]] = {}
    engine: dict[str, dict[str, float]] = {}
    for r in range(a.rounds):
        for label, tree in trees.items():
            got = _child(tree, batches, a.vocab, a.calls)
            print(f"round {r + 1} {label}: {got}", file=sys.stderr)
            for workload, per in got.items():
                slot = best.setdefault(label, {}).setdefault(workload, {})
                for b, ms in per.items():
                    slot[b] = min(ms, slot.get(b, float("inf")))
            if a.engine:
                tok_s = _child(tree, batches, a.vocab, a.calls, engine=True)["engine"]
                print(f"round {r + 1} {label} engine: {tok_s}", file=sys.stderr)
                slot = engine.setdefault(label, {})
                for name, v in tok_s.items():
                    slot[name] = max(v, slot.get(name, 0.0))
    env = environment()
    env["threads"] = 1
    data = {"environment": env, "batches": batches, "vocab": a.vocab, "calls": a.calls, "rounds": a.rounds,
            "baseline": a.baseline, "ms": best}
    lines = [f"`Sampler.sample_tensor` per step, {a.vocab}-token vocabulary, 1 thread, median of {a.calls} calls "
             f"(new logits each), best of {a.rounds} interleaved runs, half the rows seeded; {env['cpu']} "
             f"({env['cpu_capability']}), {env['when']}.", "",
             "| workload | tree | " + " | ".join(f"batch {b}: ms (ms/row)" for b in batches) + " |",
             "|---|---|" + "---:|" * len(batches)]
    for workload in WORKLOADS:
        for label in trees:
            per = best[label][workload]
            lines.append(f"| {workload} | {label} | "
                         + " | ".join(f"{per[str(b)]:.2f} ({per[str(b)] / b:.3f})" for b in batches) + " |")
        if a.baseline:
            base, ours = best[f"baseline {a.baseline}"][workload], best["this tree"][workload]
            ratios = {str(b): base[str(b)] / ours[str(b)] for b in batches}
            data.setdefault("speedup", {})[workload] = ratios
            lines.append(f"| {workload} | **baseline ÷ this tree** | "
                         + " | ".join(f"**{ratios[str(b)]:.1f}×**" for b in batches) + " |")
    if a.engine:
        data["engine_tok_s"] = engine
        lines += ["", "SmolLM2-135M, `LLM.generate`, 8 requests x 64 tokens decoded together (best of the rounds):", "",
                  "| tree | greedy tok/s | temperature 0.7, top-p 0.9 tok/s | top-p ÷ greedy |", "|---|---:|---:|---:|"]
        for label in trees:
            e = engine[label]
            lines.append(f"| {label} | {e['greedy']:.0f} | {e['top_p']:.0f} | {e['top_p'] / e['greedy']:.2f} |")
    table = "\n".join(lines) + "\n"
    write_results("sampler", data, table)
    print(table)


if __name__ == "__main__":
    main()
