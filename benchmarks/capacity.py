"""Capacity plan against reality: real SmolLM2 CPU workers under the load the plan was made for.

`python -m benchmarks.capacity [--targets-ms 1000,80] [--prompt-tokens 128] [--output-tokens 32]
[--seconds 60]`: starts a worker (1 thread, warm-up and load curve on), reads its measured load curve
(GET /load_curve), and asks the planner (controlplane/deployments/capacity/) what one replica holds
at the targets (default: the premium tier's TTFT 1000 ms / ITL 80 ms p95). Then it measures:

1. one worker under Poisson load at 0.6x, 1x and 1.4x the predicted capacity: the SLO attainment
   (share of requests within each target) and the p95s at each rate, so the predicted edge can be
   compared with where the real one breaks;
2. one real worker's capacity, read off those runs (where each p95 crosses its target, linear in the
   rate between the last rate that held and the first that did not), and for fleet loads of 1.2, 3, 6
   and 12x the predicted capacity the plan's replicas against those the measured capacity needs
   (the issue's check: within one replica or 25 %);
3. on a host with at least 4 cores, the 1.2x load against 1 and 2 real workers. On 2 cores it is
   skipped: two one-thread workers (each also has its HTTP loop) and the client have no core of
   their own, and two workers ran slower than one (benchmarks/results/history/capacity.md).

The client is the minimal asyncio HTTP one of benchmarks/serve_client.py (the lightest on the CPU)
and spreads requests round-robin over the workers (the gateway's least-loaded routing does no worse).
On a 2-core host two workers of one thread each and the client share the cores: the second
worker's run is the most contended, so its figures are a lower bound. Record the CPU with the result.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import httpx

from benchmarks.common import environment, percentile, write_results
from benchmarks.serve_client import MODEL, Req, Result, poisson, start_worker, via_raw, wait_ready
from controlplane.deployments.capacity.curve import LoadCurve
from controlplane.deployments.capacity.plan import Targets, plan_replicas, replica_capacity
from controlplane.deployments.capacity.simulate import Load, simulate

ENGINE = {"dtype": "bfloat16", "kv_cache_memory": "256MiB", "max_num_seqs": 32, "max_num_batched_tokens": 512,
          "threads": 1}


def worker_command() -> list[str]:
    return [sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--log-level", "warning", "--warmup",
            "--load-curve", *(f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items())]


def prompt_of(tokenizer, n: int, i: int) -> str:
    """A prompt of exactly n tokens, distinct per request (no prefix-cache hits flatter the run)."""
    words = [f"w{(i * 7919 + j * 104729) % 100003}" for j in range(4 * n)]
    ids = tokenizer.encode(" ".join(words))[:n - 1]
    return tokenizer.decode(ids)


def measure(urls: list[str], rps: float, seconds: float, prompt_tokens: int, output_tokens: int, tokenizer,
            seed: int) -> dict:
    n = max(8, int(rps * seconds))
    reqs = [Req(prompt_of(tokenizer, prompt_tokens, seed * 100_000 + i), output_tokens) for i in range(n)]
    ring = itertools.cycle(urls)

    async def one(req: Req) -> Result:
        return await via_raw(next(ring), {}, req)

    started = time.perf_counter()
    results = asyncio.run(poisson(one, reqs, rps, seed))
    wall = time.perf_counter() - started
    ok = [r for r in results if r.error is None and r.times]
    skip = len(ok) // 10  # the first tenth: the empty start, as the planner's simulation skips it
    ok = sorted(ok, key=lambda r: r.start)[skip:]
    ttfts = [r.times[0] - r.start for r in ok]
    itls = [(r.times[-1] - r.times[0]) / (len(r.times) - 1) for r in ok if len(r.times) > 1]
    return {"rps": rps, "workers": len(urls), "requests": len(results), "errors": len(results) - len(ok) - skip,
            "wall_seconds": round(wall, 1), "ttft_p95_ms": 1000 * percentile(ttfts, 95),
            "itl_p95_ms": 1000 * percentile(itls, 95), "ttfts": ttfts, "itls": itls}


def attainment(run: dict, targets: Targets) -> dict:
    within_ttft = sum(t <= targets.ttft_seconds for t in run["ttfts"]) / max(len(run["ttfts"]), 1)
    within_itl = sum(t <= targets.itl_seconds for t in run["itls"]) / max(len(run["itls"]), 1)
    held = run["ttft_p95_ms"] <= targets.ttft_seconds * 1000 and run["itl_p95_ms"] <= targets.itl_seconds * 1000
    return {"ttft_within": within_ttft, "itl_within": within_itl, "held": held}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets-ms", default="1000,80", help="TTFT,ITL p95 targets in ms (default: premium's)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60.0, help="of load per measured rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fleet-factor", type=float, default=1.2, help="the fleet load, x one replica's capacity")
    p.add_argument("--render", help="re-derive the checks and the table from a saved capacity.json")
    args = p.parse_args()
    if args.render:
        report(json.loads(Path(args.render).read_text()))
        return
    load_start = os.getloadavg()[0]
    ttft_ms, itl_ms = (float(x) for x in args.targets_ms.split(","))
    targets = Targets(ttft_ms / 1000, itl_ms / 1000)
    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(resolve_model_path(MODEL), ())  # the worker's own
    procs = []
    try:
        first, url_a = start_worker(worker_command())
        procs.append(first)
        wait_ready(url_a, first, timeout=600)
        curve_data = httpx.get(url_a + "/load_curve", timeout=10).json()
        curve = LoadCurve.from_dict(curve_data)
        capacity = replica_capacity(curve, args.prompt_tokens, args.output_tokens, targets)
        print(f"load curve: {curve_data}\npredicted capacity of one replica: {capacity:.2f} req/s", flush=True)
        singles = []
        for factor in (0.6, 0.8, 1.0, 1.2, 1.4):
            rps = capacity * factor
            run = measure([url_a], rps, args.seconds, args.prompt_tokens, args.output_tokens, tokenizer, args.seed)
            sim = simulate(curve, Load(rps, args.prompt_tokens, args.output_tokens), seed=args.seed)
            run.update(factor=factor, predicted_ttft_p95_ms=sim.ttft_p95 * 1000, predicted_itl_p95_ms=sim.itl_p95 * 1000,
                       predicted_held=targets.met(sim), **attainment(run, targets))
            singles.append(run)
            print(f"1 worker at {rps:.2f} req/s: TTFT p95 {run['ttft_p95_ms']:.0f} ms (predicted "
                  f"{run['predicted_ttft_p95_ms']:.0f}), ITL p95 {run['itl_p95_ms']:.1f} ms (predicted "
                  f"{run['predicted_itl_p95_ms']:.1f}), held {run['held']}", flush=True)
        load = args.fleet_factor * capacity
        fleet = []
        skipped = None if (os.cpu_count() or 1) >= 4 else f"{os.cpu_count()} cores: two workers have no core of their own"
        if not skipped:
            second, url_b = start_worker(worker_command())
            procs.append(second)
            wait_ready(url_b, second, timeout=600)
        for urls in ([] if skipped else [[url_a], [url_a, url_b]]):
            run = measure(urls, load, args.seconds, args.prompt_tokens, args.output_tokens, tokenizer, args.seed + 1)
            run.update(**attainment(run, targets))
            fleet.append(run)
            print(f"{len(urls)} worker(s) at {load:.2f} req/s: TTFT p95 {run['ttft_p95_ms']:.0f} ms, ITL p95 "
                  f"{run['itl_p95_ms']:.1f} ms, held {run['held']}", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    data = {"environment": environment(), "targets_ms": [ttft_ms, itl_ms], "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens, "seconds": args.seconds, "engine": ENGINE, "curve": curve_data,
            "predicted_replica_rps": capacity, "single": [_strip(r) for r in singles],
            "planned_load_rps": load, "fleet": [_strip(r) for r in fleet], "fleet_skipped": skipped,
            "fleet_factor": args.fleet_factor, "load_average_start_end": [load_start, os.getloadavg()[0]]}
    report(data)


def report(data: dict) -> None:
    """Derive the checks from the measured runs (also for a saved JSON: --render), write and print."""
    targets = Targets(data["targets_ms"][0] / 1000, data["targets_ms"][1] / 1000)
    curve = LoadCurve.from_dict(data["curve"])
    p, o = data["prompt_tokens"], data["output_tokens"]
    measured = measured_capacity(data["single"], targets)
    data["measured_replica_rps"] = measured
    checks = []
    for factor in FLEET_FACTORS:
        rps = factor * data["predicted_replica_rps"]
        planned = plan_replicas(curve, rps=rps, prompt_tokens=p, output_tokens=o, targets=targets).replicas
        needed = math.ceil(rps / measured) if measured else None
        ok = needed is not None and (abs(planned - needed) <= 1 or abs(planned - needed) <= 0.25 * needed)
        checks.append({"rps": rps, "planned": planned, "needed_by_measured_capacity": needed, "within": ok})
    data["fleet_checks"] = checks
    for run in data["fleet"]:
        run["planned"] = plan_replicas(curve, rps=run["rps"], prompt_tokens=p, output_tokens=o,
                                       targets=targets).replicas
    jpath, mpath = write_results("capacity", data, table(data))
    print(table(data))
    print(f"wrote {jpath} and {mpath}")


FLEET_FACTORS = (1.2, 3.0, 6.0, 12.0)


def measured_capacity(singles: list[dict], targets: Targets) -> float | None:
    """Where one real worker's p95s cross the targets: linear in the rate between the highest rate that
    held and the next that did not; the highest rate tried when all held; None when none held."""
    runs = sorted(singles, key=lambda r: r["rps"])
    held = [r for r in runs if r["held"]]
    if not held:
        return None
    last = held[-1]
    after = next((r for r in runs if r["rps"] > last["rps"] and not r["held"]), None)
    if after is None:
        return last["rps"]
    edge = after["rps"]
    for key, target in (("ttft_p95_ms", targets.ttft_seconds * 1000), ("itl_p95_ms", targets.itl_seconds * 1000)):
        lo, hi = last[key], after[key]
        if hi > target >= lo and hi > lo:
            edge = min(edge, last["rps"] + (after["rps"] - last["rps"]) * (target - lo) / (hi - lo))
    return edge


def _strip(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in ("ttfts", "itls")}


def table(d: dict) -> str:
    env = d["environment"]
    t_ttft, t_itl = d["targets_ms"]
    lines = ["# Capacity plan against real workers\n",
             f"{env['cpu']} ({env['cpu_capability']}), {env['when']}; SmolLM2-135M bf16, one thread per worker; "
             f"{d['prompt_tokens']} prompt + {d['output_tokens']} output tokens, Poisson arrivals, "
             f"{d['seconds']:.0f} s per rate; targets TTFT p95 <= {t_ttft:.0f} ms, ITL p95 <= {t_itl:.0f} ms. "
             f"`python -m benchmarks.capacity`\n",
             f"Predicted capacity of one replica (from its measured load curve): **{d['predicted_replica_rps']:.2f} req/s**.\n",
             "| workers | load (req/s) | × predicted capacity | TTFT p95 ms (predicted) | ITL p95 ms (predicted) | "
             "within TTFT | within ITL | held |",
             "|---:|---:|---:|---:|---:|---:|---:|:--|"]
    for r in d["single"]:
        lines.append(f"| 1 | {r['rps']:.2f} | {r['factor']:.1f} | {r['ttft_p95_ms']:.0f} ({r['predicted_ttft_p95_ms']:.0f}) | "
                     f"{r['itl_p95_ms']:.1f} ({r['predicted_itl_p95_ms']:.1f}) | {r['ttft_within']:.0%} | "
                     f"{r['itl_within']:.0%} | {'yes' if r['held'] else 'no'} |")
    for r in d["fleet"]:
        lines.append(f"| {r['workers']} | {r['rps']:.2f} | {d['fleet_factor']:.1f} | {r['ttft_p95_ms']:.0f} | "
                     f"{r['itl_p95_ms']:.1f} | "
                     f"{r['ttft_within']:.0%} | {r['itl_within']:.0%} | {'yes' if r['held'] else 'no'} |")
    measured = d["measured_replica_rps"]
    lines.append("\nOne real worker's capacity at the targets (where its p95s cross them between the rates tried): "
                 + (f"**{measured:.2f} req/s**; the prediction ({d['predicted_replica_rps']:.2f}) is "
                    f"{d['predicted_replica_rps'] / measured:.2f}× of it."
                    if measured else "below the lowest rate tried."))
    lines += ["\n| fleet load (req/s) | plan (replicas) | needed at the measured capacity | within ±1 or 25 % |",
              "|---:|---:|---:|:--|"]
    for c in d["fleet_checks"]:
        lines.append(f"| {c['rps']:.2f} | {c['planned']} | {c['needed_by_measured_capacity'] or '–'} | "
                     f"{'yes' if c['within'] else 'no'} |")
    if d.get("fleet_note"):
        lines.append(f"\n{d['fleet_note']}")
    if d.get("fleet_skipped"):
        lines.append(f"\nThe fleet itself was not run: {d['fleet_skipped']}.")
    lines.append(f"\nLoad average (1 min) at the start / end: {d['load_average_start_end'][0]:.1f} / "
                 f"{d['load_average_start_end'][1]:.1f}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
