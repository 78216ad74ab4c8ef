"""Serving benchmark: a load generator over HTTP against a worker, and the HTTP path's overhead.

    python -m benchmarks.serve [--rates 1,2,4] [--requests 16] [--url http://127.0.0.1:8100] [--no-compare]

Rate sweep: Poisson arrivals at each rate, streaming `/v1/completions` (async: a minimal HTTP/1.1
client by default, `--client httpx` for httpx). Prompts and output lengths are drawn once with a
fixed seed from log-normal distributions shaped like chat traffic (long right tails), scaled to a
2-core CPU: prompt median 160 tokens (16..1024), output median 48
(8..192). Outputs run to their drawn length (`ignore_eos`), so every run does the same work.
Reports output-token throughput, TTFT / ITL / end-to-end percentiles and errors.

HTTP overhead: the same requests at 32 concurrent streams, through HTTP to the worker process and
directly through an in-process AsyncLLM with the same settings, alternated in ABBA order (HTTP,
direct, direct, HTTP, ...) so drift on a shared machine hits both alike. The load generator runs on the same
machine as the worker, so its own parsing is part of the HTTP path's cost here.

Without --url the script starts a worker (`python -m dataplane.worker`) on a free port and stops it.
Results: benchmarks/results/serve.json and serve.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import signal
import statistics
import time

import httpx

from benchmarks.common import environment, fmt, percentile, write_results
from benchmarks.engine import make_prompt
from benchmarks.serve_client import (
    ENGINE,
    MODEL,
    Req,
    Result,
    closed_loop,
    poisson,
    process_cpu,
    start_worker,
    via_httpx,
    via_raw,
    wait_ready,
)


def lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(round(math.exp(rng.gauss(math.log(median), sigma))))))


def workload(tokenizer, n: int, seed: int) -> list[Req]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        ids = make_prompt(rng, tokenizer, lognormal(rng, 160, 0.9, 16, 1024))
        reqs.append(Req(tokenizer.decode(ids), lognormal(rng, 48, 0.7, 8, 192)))
    return reqs


async def direct(engine, req: Req) -> Result:
    from dataplane.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True, temperature=0)
    res = Result(time.perf_counter())
    async for delta in engine.generate(req.prompt, params):
        for out in delta.outputs:
            res.tokens += len(out.token_ids)
            if out.text:
                res.times.append(time.perf_counter())
    res.end = time.perf_counter()
    return res


async def measured(pattern, pids: list[int | None]) -> tuple[list[Result], list[float]]:
    """Run a load pattern; also return the CPU seconds each given process spent on it."""
    before = [process_cpu(p) for p in pids]
    results = await pattern
    return results, [process_cpu(p) - b for p, b in zip(pids, before, strict=True)]


def summarize(label: str, results: list[Result], cpu_s: list[float] | None = None, **extra) -> dict:
    ok = [r for r in results if r.error is None]
    duration = max(r.end for r in results) - min(r.start for r in results)
    ttft = [(r.times[0] - r.start) * 1000 for r in ok if r.times]
    itl = [(b - a) * 1000 for r in ok for a, b in zip(r.times, r.times[1:], strict=False)]
    e2e = [(r.end - r.start) * 1000 for r in ok]
    tokens = sum(r.tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    out = {"label": label, **extra, "requests": len(results), "errors": errors, "duration_s": duration,
           "output_tokens": tokens, "tokens_per_s": tokens / duration, "requests_per_s": len(ok) / duration,
           # [serving process, load generator] CPU milliseconds per output token
           "cpu_ms_per_token": None if cpu_s is None or not tokens else [1000 * c / tokens for c in cpu_s]}
    for name, values in (("ttft_ms", ttft), ("itl_ms", itl), ("e2e_ms", e2e)):
        out[name] = {f"p{q}": percentile(values, q) for q in (50, 95, 99)}
    print(f"  {label}: {out['tokens_per_s']:.0f} tok/s, TTFT p50 {fmt(out['ttft_ms']['p50'], 0)} ms, "
          f"ITL p50 {fmt(out['itl_ms']['p50'], 0)} ms, errors {sum(errors.values())}", flush=True)
    return out


async def run(args) -> dict:
    from dataplane.models.loader import load_model  # noqa: F401  (imports torch before timing anything)
    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(resolve_model_path(MODEL), ())
    proc, url = (None, args.url) if args.url else start_worker()
    engine = None
    try:
        if not args.no_compare:  # loads while the worker loads
            from dataplane.engine.async_llm import AsyncLLM

            engine = await asyncio.to_thread(AsyncLLM.from_args, MODEL, progress=False, **ENGINE)
            gc.collect()
            gc.freeze()  # as the worker does once its model is attached
        wait_ready(url, proc)
        token = os.environ.get("TESSERA_WORKER_TOKEN") if args.url else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=None, limits=limits, headers=headers, trust_env=False) as client:
            if args.client == "httpx":
                http_one = lambda req: via_httpx(client, url, req)  # noqa: E731
            else:
                http_one = lambda req: via_raw(url, headers, req)  # noqa: E731
            warm = workload(tokenizer, args.concurrency, 99)  # the batch shapes of the runs that follow
            await closed_loop(http_one, warm, args.concurrency)
            rates = []
            print("rate sweep (Poisson arrivals, HTTP)", flush=True)
            for i, rate in enumerate([] if args.skip_rates else args.rates):
                reqs = workload(tokenizer, args.requests, args.seed + i)
                res, cpu = await measured(poisson(http_one, reqs, rate, args.seed + i),
                                          [proc.pid, None] if proc else [None])
                rates.append(summarize(f"{rate:g} req/s", res, cpu if proc else None, rate=rate))
            compare = None
            if engine is not None:
                print(f"HTTP vs in-process at {args.concurrency} concurrent streams", flush=True)
                await closed_loop(lambda r: direct(engine, r), warm, args.concurrency)
                reqs = workload(tokenizer, args.compare_requests, args.seed + 100)
                runs = []
                for rep in range(args.repeats):
                    # ABBA order (http, direct, direct, http, ...) so neither path always runs first.
                    for path in ("http", "direct") if rep % 2 == 0 else ("direct", "http"):
                        if path == "http":  # CPU: the worker, then this process (the load generator)
                            res, cpu = await measured(closed_loop(http_one, reqs, args.concurrency),
                                                      [proc.pid, None] if proc else [None])
                            cpu = cpu if proc else None
                        else:
                            res, cpu = await measured(closed_loop(lambda r: direct(engine, r), reqs,
                                                                  args.concurrency), [None])
                        runs.append(summarize(f"{path} #{rep + 1}", res, cpu, path=path))
                compare = comparison(runs, args)
                print(f"  median loss over pairs {compare['throughput_loss_pct']:.1f}%", flush=True)
    finally:
        if engine is not None:
            engine.shutdown()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    http_cost = None
    if not args.no_compare:
        from benchmarks.serve_http_cost import measure as measure_http_cost

        print("HTTP path CPU per token (scripted engine, no model)", flush=True)
        http_cost = await measure_http_cost(args.concurrency, 200)
        direct_ms = [r["cpu_ms_per_token"][0] for r in compare["runs"] if r["path"] == "direct"]
        http_cost["engine_us_per_token"] = 1000 * statistics.fmean(direct_ms)
        c = http_cost[args.client]
        http_cost["share_of_engine_pct"] = 100 * (c["worker_us_per_token"] + c["client_us_per_token"]) / \
            http_cost["engine_us_per_token"]
    return {"environment": environment(), "model": MODEL, "engine": ENGINE, "seed": args.seed, "client": args.client,
            "workload": "prompt lognormal median 160 (16..1024), output lognormal median 48 (8..192), ignore_eos",
            "rates": rates, "compare": compare, "http_cost": http_cost}


def comparison(runs: list[dict], args) -> dict:
    http = [r for r in runs if r["path"] == "http"]
    direct = [r for r in runs if r["path"] == "direct"]
    pairs = [100 * (1 - h["tokens_per_s"] / d["tokens_per_s"]) for h, d in zip(http, direct, strict=True)]
    http_tps = sum(r["tokens_per_s"] for r in http) / len(http)
    direct_tps = sum(r["tokens_per_s"] for r in direct) / len(direct)
    return {"concurrency": args.concurrency, "requests": args.compare_requests, "runs": runs,
            "http_tokens_per_s": http_tps, "direct_tokens_per_s": direct_tps,
            "mean_loss_pct": 100 * (1 - http_tps / direct_tps),
            # Each HTTP run against the direct run next to it, so that load from other users drifts
            # out; the median of those is the headline figure.
            "pairwise_loss_pct": pairs,
            "throughput_loss_pct": statistics.median(pairs),
            # CPU per output token, everything included (worker + load generator for HTTP): far less
            # sensitive than wall-clock throughput to what other users run on the machine.
            "cpu_overhead_pct": None if http[0]["cpu_ms_per_token"] is None else 100 * (
                statistics.fmean(sum(r["cpu_ms_per_token"]) for r in http)
                / statistics.fmean(sum(r["cpu_ms_per_token"]) for r in direct) - 1)}


def cpu_cell(cpu: list[float] | None) -> str:
    return "–" if cpu is None else " + ".join(f"{c:.2f}" for c in cpu)


def table(data: dict) -> str:
    lines = ["| load | req | tok/s | req/s | TTFT p50 / p95 / p99 ms | ITL p50 / p95 / p99 ms | e2e p50 ms | errors "
             "| CPU ms/token: server + client |", "|---|---|---|---|---|---|---|---|---|"]
    rows = list(data["rates"]) + (data["compare"]["runs"] if data["compare"] else [])
    for r in rows:
        t, i = r["ttft_ms"], r["itl_ms"]
        lines.append(f"| {r['label']} | {r['requests']} | {r['tokens_per_s']:.0f} | {r['requests_per_s']:.2f} | "
                     f"{fmt(t['p50'], 0)} / {fmt(t['p95'], 0)} / {fmt(t['p99'], 0)} | "
                     f"{fmt(i['p50'], 0)} / {fmt(i['p95'], 0)} / {fmt(i['p99'], 0)} | {fmt(r['e2e_ms']['p50'], 0)} | "
                     f"{sum(r['errors'].values())} | {cpu_cell(r['cpu_ms_per_token'])} |")
    c = data["compare"]
    if c:
        lines += ["", f"HTTP path vs in-process AsyncLLM at {c['concurrency']} concurrent streams, {c['requests']} "
                      f"requests per run, runs alternated: **{c['throughput_loss_pct']:.1f}% throughput loss** "
                      "(median over pairs; target < 10%); per pair "
                      + ", ".join(f"{x:.1f}%" for x in c["pairwise_loss_pct"])
                      + f"; mean of runs {c['http_tokens_per_s']:.0f} vs {c['direct_tokens_per_s']:.0f} output tok/s "
                      f"({c['mean_loss_pct']:.1f}%). CPU per output token, worker + load generator for HTTP vs the "
                      f"one process for direct: {fmt(c['cpu_overhead_pct'])}% more for HTTP."]
    h = data.get("http_cost")
    if h:
        r, x = h[data["client"]], h["httpx"]
        lines += ["", f"HTTP path CPU per streamed token ({h['streams']} streams, scripted engine): worker "
                      f"{r['worker_us_per_token']:.0f} us + load generator {r['client_us_per_token']:.0f} us "
                      f"(httpx client: {x['client_us_per_token']:.0f} us), against {h['engine_us_per_token']:.0f} us "
                      f"of engine CPU per token in the direct runs: **{h['share_of_engine_pct']:.1f}%**."]
    env = data["environment"]
    lines += ["", f"{data['model']}, {data['engine']}, torch {env['torch']}, {env['threads']} threads, {env['when']}. "
                  f"Workload: {data['workload']}."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0, 4.0],
                   help="Poisson arrival rates, requests per second (default 1,2,4)")
    p.add_argument("--requests", type=int, default=16, help="requests per rate")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--compare-requests", type=int, default=48)
    p.add_argument("--repeats", type=int, default=4, help="alternated runs per path in the comparison")
    p.add_argument("--skip-rates", action="store_true", help="only the HTTP-vs-in-process comparison")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", help="an already running worker (else one is started)")
    p.add_argument("--no-compare", action="store_true", help="skip the in-process comparison")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="HTTP client of the load generator (raw: a minimal asyncio one, lighter on the CPU)")
    args = p.parse_args()
    data = asyncio.run(run(args))
    jpath, mpath = write_results("serve", data, table(data))
    print(table(data))
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
