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
import torch.distributed as dist

from benchmarks.common import cpu_seconds, environment, fmt, write_results
from dataplane import SamplingParams
from dataplane.engine.llm import LLM

MODEL = "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):",
           "List three colours of the rainbow:", "Explain what a CPU cache is.", "Once upon a time, in a small village,",
           "The three laws of thermodynamics are", "Translate to French: the cat sleeps."]


def cpu_now(llm: LLM) -> float:
    """CPU seconds of this process and of the engine's follower ranks: a cost that other load on the
    host does not inflate (time waiting for a descheduled rank costs no CPU)."""
    followers = getattr(llm.core.model, "procs", [])
    return time.process_time() + sum(cpu_seconds(f.proc.pid) for f in followers)


def run(llm: LLM, prompts: list[str], tokens: int, threads: int) -> tuple[float, float, list[list[int]]]:
    """(decode tok/s, CPU ms per generated token with prefill, token ids)."""
    torch.set_num_threads(threads)  # rank 0 of TP=3 shares this process with the TP=1 engine
    c0 = cpu_now(llm)
    outs = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    cpu = cpu_now(llm) - c0
    decoded = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    window = max(o.metrics.finished_time for o in outs) - max(o.metrics.first_token_time for o in outs)
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    return decoded / window, 1000 * cpu / generated, [o.outputs[0].token_ids for o in outs]


def bare_all_reduce(size: int, rows: int, n: int = 600) -> dict:
    """The floor under TP's step time: `size` gloo processes doing nothing but all-reduce [rows, 576]."""
    import subprocess
    import sys

    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.tensor_parallel", "--all-reduce-rank", str(r),
                               "--port", str(store.port), "--tp", str(size), "--rows", str(rows)])
             for r in range(1, size)]
    try:
        return _all_reduce_loop(0, size, store, rows, n)
    finally:
        for p in procs:
            p.wait(60)


def _all_reduce_loop(rank: int, size: int, store, rows: int, n: int = 600) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size, store=store)
    x = torch.ones(rows, 576)
    for _ in range(50):
        dist.all_reduce(x)
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        dist.all_reduce(x)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    dist.destroy_process_group()
    return {"rows": rows, "wall_us": 1e6 * wall / n, "rank0_cpu_us": 1e6 * cpu / n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--all-reduce-rank", type=int, help=argparse.SUPPRESS)  # bare_all_reduce's other ranks
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=1, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.all_reduce_rank is not None:
        store = dist.TCPStore("127.0.0.1", opts.port, opts.tp, is_master=False)
        _all_reduce_loop(opts.all_reduce_rank, opts.tp, store, opts.rows)
        return
    all_threads = torch.get_num_threads()
    load_before = os.getloadavg()
    one = LLM(MODEL, dtype="float32", kv_cache_memory="128MiB")
    t0 = time.perf_counter()
    tp = LLM(MODEL, dtype="float32", kv_cache_memory="128MiB", tensor_parallel_size=opts.tp)
    tp_start_s = time.perf_counter() - t0
    tp_threads = torch.get_num_threads()  # what the launch chose per rank
    # One process with all threads (the naive peer), one process with one thread (per-core work), TP.
    sides = [(f"TP=1, {all_threads} threads", one, all_threads), ("TP=1, 1 thread", one, 1),
             (f"TP={opts.tp}, {tp_threads} thread(s) per rank", tp, tp_threads)]
    for _, llm, threads in sides:  # warm-up: first-call allocations and oneDNN's per-shape builds
        for batch in (1, 8):
            run(llm, PROMPTS[:batch], 4, threads)
    runs: dict[str, dict[str, dict[str, list[float]]]] = {
        f"batch_{b}": {name: {"tok_s": [], "cpu_ms": []} for name, _, _ in sides} for b in (1, 8)}
    shares: dict[str, dict] = {}  # rank 0's time in collectives during the TP runs
    identical = True
    for r in range(opts.rounds):
        for batch in (1, 8):
            prompts = [PROMPTS[r % len(PROMPTS)]] if batch == 1 else PROMPTS
            reference = None
            for name, llm, threads in sides:
                comm = getattr(llm.core.model, "comm", None)
                c0 = (comm.all_reduce_seconds, comm.broadcast_seconds, comm.broadcasts) if comm else None
                w0 = time.perf_counter()
                tok_s, cpu_ms, ids = run(llm, prompts, opts.tokens, threads)
                runs[f"batch_{batch}"][name]["tok_s"].append(tok_s)
                runs[f"batch_{batch}"][name]["cpu_ms"].append(cpu_ms)
                reference = ids if reference is None else reference
                identical &= ids == reference
                if comm is not None:
                    share = shares.setdefault(f"batch_{batch}", {"wall_s": 0.0, "all_reduce_s": 0.0,
                                                                  "broadcast_s": 0.0, "steps": 0})
                    share["wall_s"] += time.perf_counter() - w0
                    share["all_reduce_s"] += comm.all_reduce_seconds - c0[0]
                    share["broadcast_s"] += comm.broadcast_seconds - c0[1]
                    share["steps"] += comm.broadcasts - c0[2]
    tp.close()
    floor = [bare_all_reduce(opts.tp, rows) for rows in (1, 8)]
    load_after = os.getloadavg()
    rows, summary = [], {}
    tp1_names = [name for name, llm, _ in sides if llm is one]
    for key, by_side in runs.items():
        # The naive peer is one process at its better thread count on this host, at this batch.
        base = max(statistics.median(by_side[name]["tok_s"]) for name in tp1_names)
        s = shares[key]
        summary[key] = {"rank0_collectives": s}
        for name, llm, _ in sides:
            tok_s = statistics.median(by_side[name]["tok_s"])
            cpu_ms = statistics.median(by_side[name]["cpu_ms"])
            summary[key][name] = {"decode_tok_s": tok_s, "cpu_ms_per_token": cpu_ms, "vs_tp1": tok_s / base,
                                  "runs": by_side[name]}
            comm = (f"{100 * s['all_reduce_s'] / s['wall_s']:.0f}% | {1000 * s['broadcast_s'] / s['steps']:.2f} ms"
                    if llm is tp else "– | –")
            rows.append(f"| {key.replace('_', ' ')} | {name} | {fmt(tok_s)} | {tok_s / base:.2f}x | {fmt(cpu_ms)} | "
                        f"{comm} |")
    env = {**environment(), "cores": os.cpu_count(), "threads_tp1": all_threads, "threads_per_rank": tp_threads,
           "load_average_before": load_before, "load_average_after": load_after}
    command = f"python -m benchmarks.tensor_parallel --rounds {opts.rounds} --tokens {opts.tokens} --tp {opts.tp}"
    data = {"model": MODEL, "dtype": "float32", "tensor_parallel_size": opts.tp, "tokens": opts.tokens,
            "rounds": opts.rounds, "tp_start_s": tp_start_s, "greedy_outputs_identical": identical,
            "bare_all_reduce": floor,
            "results": summary, "environment": env, "command": command}
    table = "\n".join([
        f"Tensor parallelism on the CPU: SmolLM2-135M-Instruct float32, greedy, {opts.tokens} tokens per request, "
        f"median of {opts.rounds} rounds alternating the three set-ups. {env['cpu']}, {env['cores']} cores, "
        f"{time.strftime('%Y-%m-%d')}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"(a host shared with other work). Greedy outputs identical across the three: "
        f"{'yes' if identical else 'NO'}. Starting the {opts.tp} ranks took {tp_start_s:.1f} s.",
        "",
        "| decode | engine | tok/s | vs the faster TP=1 | CPU ms/token (all processes) | rank 0 in all-reduce | "
        "step broadcast |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Decode tok/s: tokens after the first / (last finish - last first token). CPU ms/token: CPU seconds of "
        "every process of the engine per generated token, prefill included (with more threads than free cores, "
        "OpenMP's spinning threads inflate it). Rank 0 in all-reduce: share of its wall time in the 60 "
        "all-reduces per step (2 per layer), waiting for the slowest rank included. Step broadcast: rank 0's "
        "time per step to send the step's input (pickled token ids, positions, attention metadata).",
        "",
        f"The floor under a TP step on this host: a bare gloo all-reduce between {opts.tp} processes (1 thread each, "
        "nothing else to do) took " + " and ".join(
            f"{f['wall_us']:.0f} us wall ({f['rank0_cpu_us']:.0f} us CPU on rank 0) for [{f['rows']}, 576]"
            for f in floor) + f"; a step has 60 of them: {60 * floor[0]['wall_us'] / 1000:.0f} ms at batch 1, "
        f"a ceiling of {1e6 / (60 * floor[0]['wall_us']):.0f} tok/s before any maths.",
        "",
        f"`{command}`",
    ])
    jpath, mpath = write_results("tensor_parallel", data, table)
    print(table)
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
