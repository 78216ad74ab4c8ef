"""The worker over HTTP against the offline engine, in one run: what serving costs a tenant.

    python -m benchmarks.serve_vs_offline [--rounds 2] [--batch1-requests 4] [--concurrency 32]
    python -m benchmarks.serve_vs_offline --first-pass   # a fresh worker's first pass vs its second
    python -m benchmarks.serve_vs_offline --gguf --name serve_vs_offline_gguf   # the GGUF blocks, both sides

Default mode: the offline `LLM.generate` in this process and a real worker process
(`python -m dataplane.worker`, same engine settings) on the same prompts: SmolLM2 bf16, greedy,
ignore_eos, 64 new tokens, short distinct prompts. Batch 1 (one request at a time) and 32
concurrent, over HTTP both non-streamed and streamed. Each round runs every path once on fresh
prompts (so neither engine's prefix cache helps), alternating which goes first; the figure per
path is the best round. A warm-up round over the same shapes runs first and is not counted.
Output tokens per second are wall clock, prefill included; the ratio is HTTP / offline.

--gguf: both sides keep the GGUF's own blocks (quantization="gguf", a dense copy above 8 rows), so
batch-1 decode steps run as one C++ call (models/fused_decode.py): the step is ~4 ms instead of
~10, and what serving adds per token weighs more.

--first-pass: start a worker with `--no-warmup`, then one with its start-up warm-up, and time
each one's first and second pass at 32 concurrent (the first pass over new batch shapes pays for
oneDNN building its kernels), with the time each took to turn ready.

Results: benchmarks/results/serve_vs_offline.json and .md (serve_vs_offline_first_pass.* for --first-pass;
earlier runs and variants are folded into benchmarks/results/history/serve_vs_offline.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import time

import httpx
import orjson

from benchmarks.common import environment, write_results
from benchmarks.engine import make_prompt
from benchmarks.serve_client import MODEL, Req, closed_loop, process_cpu, start_worker, via_raw, wait_ready

SETTINGS = {"dtype": "auto", "kv_cache_memory": "512MiB", "max_num_seqs": 64, "max_num_batched_tokens": 512}
MAX_TOKENS = 64


def prompts(tokenizer, n: int, seed: int) -> list[str]:
    """Short distinct prompts (12..24 tokens), a number first so no two share a cached block."""
    rng = random.Random(seed)
    return [f"{seed}-{i}: " + tokenizer.decode(make_prompt(rng, tokenizer, rng.randint(12, 24))) for i in range(n)]


def worker_command(extra: list[str]) -> list[str]:
    import sys

    return [sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--log-level", "warning",
            *(f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()), *extra]


# -- the three paths: each returns output tokens per second over the prompts ---------------------------
def offline(llm, texts: list[str], concurrency: int) -> float:
    from dataplane.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0)
    t0, tokens = time.perf_counter(), 0
    for i in range(0, len(texts), concurrency):
        for out in llm.generate(texts[i:i + concurrency], params):
            tokens += len(out.outputs[0].token_ids)
    return tokens / (time.perf_counter() - t0)


async def http_whole(client: httpx.AsyncClient, url: str, prompt: str) -> int:
    body = orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                         "temperature": 0})
    r = await client.post(url + "/v1/completions", content=body, headers={"Content-Type": "application/json"})
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


async def http_streamed(url: str, prompt: str) -> int:
    res = await via_raw(url, {}, Req(prompt, MAX_TOKENS))
    if res.error is not None:
        raise RuntimeError(f"streamed request failed: {res.error}")
    return res.tokens


async def over_http(one, texts: list[str], concurrency: int) -> float:
    t0 = time.perf_counter()
    counts = await closed_loop(one, texts, concurrency)
    return sum(counts) / (time.perf_counter() - t0)


async def _now(value: float) -> float:
    return value


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- default mode ---------------------------------------------------------------------------------------
async def compare(args) -> dict:
    from dataplane.engine.llm import LLM

    if args.threads:  # the same intra-op thread count on both sides
        import torch

        torch.set_num_threads(args.threads)
        args.worker_arg = [*args.worker_arg, f"--threads={args.threads}"]
    proc, url = start_worker(worker_command(args.worker_arg))
    try:
        llm = LLM(MODEL, **SETTINGS)  # loads while the worker loads
        wait_ready(url, proc)
        tok = llm.tokenizer
        async with httpx.AsyncClient(timeout=None, trust_env=False,
                                     limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)) as client:
            paths = {
                # on this (the main) thread, as a script calls it; nothing else runs meanwhile
                "offline": lambda texts, c: _now(offline(llm, texts, c)),
                "http": lambda texts, c: over_http(lambda p: http_whole(client, url, p), texts, c),
                "http_stream": lambda texts, c: over_http(lambda p: http_streamed(url, p), texts, c),
            }
            cases = {"batch 1": (args.batch1_requests, 1), f"{args.concurrency} concurrent":
                     (args.concurrency, args.concurrency)}
            rounds: list[dict] = []
            for r in range(-1, args.rounds):  # round -1: warm-up, not counted
                row: dict = {"round": r, "load_average": load_average(), "tokens_per_s": {}, "cpu_ms_per_token": {}}
                for ci, (case, (n, conc)) in enumerate(cases.items()):
                    order = list(paths) if (r + ci) % 2 == 0 else list(reversed(paths))
                    for name in order:
                        texts = prompts(tok, n, seed=1000 * (r + 2) + 10 * ci + list(paths).index(name))
                        # CPU of the process doing the work (this one offline, the worker over HTTP):
                        # far steadier than wall clock on a shared machine
                        pid = None if name == "offline" else proc.pid
                        cpu0 = process_cpu(pid)
                        tps = await paths[name](texts, conc)
                        row["tokens_per_s"][f"{case} / {name}"] = tps
                        row["cpu_ms_per_token"][f"{case} / {name}"] = 1000 * (process_cpu(pid) - cpu0) / (
                            n * MAX_TOKENS)
                print(f"round {r}: " + ", ".join(f"{k} {v:.1f}" for k, v in row["tokens_per_s"].items())
                      + f"; load {row['load_average']}", flush=True)
                if r >= 0:
                    rounds.append(row)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    best = {k: max(row["tokens_per_s"][k] for row in rounds) for k in rounds[0]["tokens_per_s"]}
    summary = {}
    for case in cases:
        off = best[f"{case} / offline"]
        summary[case] = {"offline": off, **{p: best[f"{case} / {p}"] for p in ("http", "http_stream")},
                         "http_pct": 100 * best[f"{case} / http"] / off,
                         "http_stream_pct": 100 * best[f"{case} / http_stream"] / off,
                         # lowest CPU ms per output token over the rounds, per path
                         "cpu_ms_per_token": {p: min(row["cpu_ms_per_token"][f"{case} / {p}"] for row in rounds)
                                              for p in ("offline", "http", "http_stream")},
                         # the same ratios round by round, each HTTP run against the offline run beside it
                         "per_round_pct": [[round(100 * row["tokens_per_s"][f"{case} / {p}"]
                                                  / row["tokens_per_s"][f"{case} / offline"], 1)
                                            for p in ("http", "http_stream")] for row in rounds]}
    return {"environment": environment(), "model": MODEL, "settings": SETTINGS, "max_tokens": MAX_TOKENS,
            "worker_args": args.worker_arg, "rounds": rounds, "best": best, "summary": summary}


def compare_table(data: dict) -> str:
    lines = ["| case | offline tok/s | HTTP tok/s | HTTP / offline | HTTP streamed tok/s | streamed / offline "
             "| per round (HTTP, streamed) % | CPU ms/token: offline, HTTP, streamed |", "|---|---|---|---|---|---|---|---|"]
    for case, s in data["summary"].items():
        lines.append(f"| {case} | {s['offline']:.1f} | {s['http']:.1f} | **{s['http_pct']:.0f}%** | "
                     f"{s['http_stream']:.1f} | **{s['http_stream_pct']:.0f}%** | "
                     + "; ".join(f"{a:.0f}, {b:.0f}" for a, b in s["per_round_pct"]) + " | "
                     + ", ".join(f"{s['cpu_ms_per_token'][p]:.1f}" for p in ("offline", "http", "http_stream")) + " |")
    env = data["environment"]
    loads = ", ".join(str(r["load_average"]) for r in data["rounds"])
    lines += ["", f"{data['model']}, {data['settings']}, greedy, ignore_eos, {data['max_tokens']} new tokens, "
                  f"best of {len(data['rounds'])} rounds (after one warm-up round); worker flags "
                  f"{data['worker_args'] or 'default'}. {env['cpu']}, {env['threads']} torch threads here, torch "
                  f"{env['torch']}, {env['when']}; load average (1, 5, 15 min) at each round: {loads}."]
    return "\n".join(lines)


# -- --first-pass ---------------------------------------------------------------------------------------
async def first_pass(args) -> dict:
    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(resolve_model_path(MODEL), ())
    runs = []
    for label, extra in (("--no-warmup", ["--no-warmup"]), ("warm-up at start", [])):
        t0 = time.perf_counter()
        proc, url = start_worker(worker_command([*extra, *args.worker_arg]))
        try:
            wait_ready(url, proc, timeout=600)
            ready_s = time.perf_counter() - t0
            passes = []
            for p in range(2):
                texts = prompts(tok, args.concurrency, seed=5000 + p)
                passes.append(await over_http(lambda q, u=url: http_streamed(u, q), texts, args.concurrency))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        runs.append({"label": label, "ready_s": ready_s, "first": passes[0], "second": passes[1],
                     "load_average": load_average()})
        print(f"{label}: ready in {ready_s:.1f} s; first pass {passes[0]:.0f} tok/s, second {passes[1]:.0f}",
              flush=True)
    return {"environment": environment(), "model": MODEL, "settings": SETTINGS, "max_tokens": MAX_TOKENS,
            "concurrency": args.concurrency, "runs": runs}


def first_pass_table(data: dict) -> str:
    lines = [f"| worker | ready after s | first pass tok/s ({data['concurrency']} concurrent, streamed) | second pass "
             "tok/s | first / second | load average |", "|---|---|---|---|---|---|"]
    for r in data["runs"]:
        lines.append(f"| {r['label']} | {r['ready_s']:.1f} | {r['first']:.0f} | {r['second']:.0f} | "
                     f"**{100 * r['first'] / r['second']:.0f}%** | {r['load_average']} |")
    env = data["environment"]
    lines += ["", f"{data['model']}, {data['settings']}, {data['max_tokens']} new tokens, fresh prompts per pass. "
                  f"{env['cpu']}, torch {env['torch']}, {env['when']}. Ready time includes loading the model."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch1-requests", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--threads", type=int, help="torch intra-op threads, offline and in the worker (default: torch's)")
    p.add_argument("--first-pass", action="store_true", help="a fresh worker's first vs second pass, warm-up off/on")
    p.add_argument("--gguf", action="store_true", help="quantization=gguf with a dense copy above 8 rows, both sides")
    p.add_argument("--worker-arg", action="append", default=[], help="an extra worker flag (repeatable)")
    p.add_argument("--name", help="results file name (default serve_vs_offline[_first_pass])")
    args = p.parse_args()
    if args.gguf:
        SETTINGS.update(quantization="gguf", int4_dense_above=8)
    if args.first_pass:
        data = asyncio.run(first_pass(args))
        text, name = first_pass_table(data), args.name or "serve_vs_offline_first_pass"
    else:
        data = asyncio.run(compare(args))
        text, name = compare_table(data), args.name or "serve_vs_offline"
    jpath, mpath = write_results(name, data, text)
    print(text)
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
