"""Tensor parallelism on this CPU: decode tok/s of one process against TP=3 (three gloo processes).

    python -m benchmarks.tensor_parallel [--rounds R] [--tokens N] [--tp 3]

SmolLM2-135M-Instruct in float32 (greedy; the outputs of both sides are compared). Both engines live
in this process for the whole run (rank 0 of TP=3 is this process; ranks 1 and 2 are children), and
the measurements alternate TP=1 / TP=3 at batch 1 and at batch 8 for R rounds, so load drifting on
a shared host hits both sides alike. TP=1 runs with all of torch's threads; TP=3 splits them
between its ranks (one each on a 2-core host: three ranks already oversubscribe it).

Decode tok/s: tokens after the first / (last finish - last first token), per batch.
The point on a CPU is correctness and the path to GPUs, not speed: every rank streams the full
embedding/lm head and the norms, and two all-reduces per layer cross process boundaries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.common import environment, fmt, write_results
from dataplane import SamplingParams
from dataplane.engine.llm import LLM

MODEL = "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):",
           "List three colours of the rainbow:", "Explain what a CPU cache is.", "Once upon a time, in a small village,",
           "The three laws of thermodynamics are", "Translate to French: the cat sleeps."]


def run(llm: LLM, prompts: list[str], tokens: int, threads: int) -> tuple[float, list[list[int]]]:
    torch.set_num_threads(threads)  # rank 0 of TP=3 shares this process with the TP=1 engine
    outs = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    decoded = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    window = max(o.metrics.finished_time for o in outs) - max(o.metrics.first_token_time for o in outs)
    return decoded / window, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tp", type=int, default=3)
    opts = ap.parse_args()
    all_threads = torch.get_num_threads()
    load_before = os.getloadavg()
    one = LLM(MODEL, dtype="float32", kv_cache_memory="128MiB")
    t0 = time.perf_counter()
    tp = LLM(MODEL, dtype="float32", kv_cache_memory="128MiB", tensor_parallel_size=opts.tp)
    tp_start_s = time.perf_counter() - t0
    tp_threads = torch.get_num_threads()  # what the launch chose per rank
    for llm, threads in ((one, all_threads), (tp, tp_threads)):  # warm-up (first-call allocations)
        run(llm, PROMPTS[:2], 4, threads)
    results: dict[str, dict[str, list[float]]] = {f"batch_{b}": {"tp1": [], f"tp{opts.tp}": []} for b in (1, 8)}
    identical = True
    shares: dict[str, dict] = {}  # rank 0's time in collectives during the TP runs
    for r in range(opts.rounds):
        for batch in (1, 8):
            prompts = [PROMPTS[r % len(PROMPTS)]] if batch == 1 else PROMPTS
            a, ids_a = run(one, prompts, opts.tokens, all_threads)
            comm = tp.core.model.comm
            c0, w0 = (comm.all_reduce_seconds, comm.broadcast_seconds, comm.broadcasts), time.perf_counter()
            b, ids_b = run(tp, prompts, opts.tokens, tp_threads)
            share = shares.setdefault(f"batch_{batch}", {"wall_s": 0.0, "all_reduce_s": 0.0, "broadcast_s": 0.0,
                                                          "steps": 0})
            share["wall_s"] += time.perf_counter() - w0
            share["all_reduce_s"] += comm.all_reduce_seconds - c0[0]
            share["broadcast_s"] += comm.broadcast_seconds - c0[1]
            share["steps"] += comm.broadcasts - c0[2]
            identical &= ids_a == ids_b
            results[f"batch_{batch}"]["tp1"].append(a)
            results[f"batch_{batch}"][f"tp{opts.tp}"].append(b)
    tp.close()
    load_after = os.getloadavg()
    rows = []
    summary = {}
    for key, sides in results.items():
        m1, mt = statistics.median(sides["tp1"]), statistics.median(sides[f"tp{opts.tp}"])
        s = shares[key]
        summary[key] = {"tp1_tok_s": m1, f"tp{opts.tp}_tok_s": mt, "ratio": mt / m1, "runs": sides, "rank0": s}
        rows.append(f"| {key.replace('_', ' ')} | {fmt(m1)} | {fmt(mt)} | {mt / m1:.2f}x | "
                    f"{100 * s['all_reduce_s'] / s['wall_s']:.0f}% | {1000 * s['broadcast_s'] / s['steps']:.2f} ms |")
    env = {**environment(), "cores": os.cpu_count(), "threads_tp1": all_threads, "threads_per_rank": tp_threads,
           "load_average_before": load_before, "load_average_after": load_after}
    command = f"python -m benchmarks.tensor_parallel --rounds {opts.rounds} --tokens {opts.tokens} --tp {opts.tp}"
    data = {"model": MODEL, "dtype": "float32", "tensor_parallel_size": opts.tp, "tokens": opts.tokens,
            "rounds": opts.rounds, "tp_start_s": tp_start_s, "greedy_outputs_identical": identical,
            "results": summary, "environment": env, "command": command}
    table = "\n".join([
        f"Tensor parallelism on the CPU: SmolLM2-135M-Instruct float32, greedy, {opts.tokens} tokens per request, "
        f"median of {opts.rounds} alternating rounds. {env['cpu']}, {env['cores']} cores, {time.strftime('%Y-%m-%d')}; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after (a shared host). "
        f"TP=1: one process, {all_threads} threads; TP={opts.tp}: {opts.tp} gloo processes, {tp_threads} thread(s) each. "
        f"Greedy outputs identical: {'yes' if identical else 'NO'}. Starting the {opts.tp} ranks took {tp_start_s:.1f} s.",
        "",
        f"| decode | TP=1 tok/s | TP={opts.tp} tok/s | TP={opts.tp} / TP=1 | rank 0 in all-reduce | "
        "step broadcast |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Rank 0 in all-reduce: share of its wall time spent in the 60 all-reduces per step (2 per layer), waiting "
        "for the slowest rank included. Step broadcast: rank 0's time per step to send the step's input "
        "(pickled token ids, positions, attention metadata) to the other ranks.",
        "",
        f"`{command}`",
    ])
    jpath, mpath = write_results("tensor_parallel", data, table)
    print(table)
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
