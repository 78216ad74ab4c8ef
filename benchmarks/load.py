"""Overload behaviour of the full stack: tenants on three tiers through the gateway to one real worker.

    python -m benchmarks.load [--seconds 30] [--levels 1,2,4] [--max-tokens 16]

Starts a SmolLM2-135M worker and a gateway (uvicorn, its own SQLite database, the database limiter)
on free ports. Three tenants — free (priority 30), standard (20), premium (10), with the seeded
tiers' SLO targets and no rate limits, so only overload decides — send streamed chat requests as
Poisson arrivals, one third of the total rate each.

1. Capacity: premium-only traffic at rising rates (`--probe-seconds` each); capacity is the highest
   rate whose TTFT p95 stays within the premium target with nothing refused.
2. Load levels: 1×, 2× and 4× that capacity, `--seconds` each, all three tiers at once.

Per tier: requests sent, completed, refused (429 at the gateway `overloaded` / at the worker
`priority_shed`/`queue_full`), other errors, client-side TTFT p95, ITL p95 (token gaps) and
goodput (completed requests/s that met both the tier's TTFT and ITL targets). The load generator
shares the 2 CPU cores with the gateway and the worker, so absolute figures are this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from benchmarks.common import (
    db_step,
    environment,
    fmt,
    percentile,
    read_chat_stream,
    stop_processes,
    ttft_and_gaps,
    write_results,
)
from benchmarks.gateway import free_port, wait_http
from benchmarks.serve import wait_ready

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
# name, priority, TTFT p95 target ms, ITL p95 target ms (the seeded tiers' targets)
TIERS = [("free", 30, 5000, 250), ("standard", 20, 2000, 120), ("premium", 10, 1000, 80)]
# The ITL guard protects premium (priority 10): lower tiers hold one seat and 32 prefill tokens a step
# while premium is in the engine, and while premium decodes each step's prefill is cut to what the
# fitted step cost keeps within 60 ms (and 16 tokens). A/B on the AVX2 EPYC (2026-11-23) at capacity 2 req/s:
# premium ITL p95 at 2x 65 ms with the timed budget against 92 ms with the seat cap alone
# (results/history/load.md).
WORKER_FLAGS = ["--kv-cache-memory=256MiB", "--max-num-seqs=8", "--max-num-batched-tokens=256",
                "--waiting-limits=20=16,30=4", "--max-waiting=64", "--itl-guard-priority=10", "--itl-guard-tokens=32",
                "--itl-guard-seqs=1", "--itl-guard-step-tokens=16", "--itl-guard-step-ms=60", "--threads=1"]
GATEWAY_SHED = "20=6,30=2"  # gateway sheds standard at 6 queued, free at 2 (the worker's limits are the backstop)


def prepare(env: dict) -> dict[str, str]:
    return db_step(env, "tier_tenants", model=MODEL, tiers=TIERS)


async def one_request(client: httpx.AsyncClient, url: str, key: str, max_tokens: int, out: list) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Write a short note about load number {random.random():.6f}."}]}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key}"}) as r:
            if r.status_code != 200:
                raw = await r.aread()
                try:
                    code = orjson.loads(raw)["error"]["code"]
                except Exception:  # noqa: BLE001
                    code = str(r.status_code)
                out.append({"status": r.status_code, "code": code})
                return
            await read_chat_stream(r, arrivals)
        ttft, gaps = ttft_and_gaps(t0, arrivals)
        out.append({"status": 200, "code": "ok", "ttft_ms": ttft, "gaps": gaps})
    except httpx.HTTPError as exc:
        out.append({"status": 0, "code": type(exc).__name__})


async def drive(url: str, keys: dict[str, str], rates: dict[str, float], seconds: float, max_tokens: int) -> dict:
    results: dict[str, list] = {name: [] for name in rates}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:
        tasks: list[asyncio.Task] = []

        async def arrivals(name: str, rate: float) -> None:
            end = time.perf_counter() + seconds
            while rate > 0:
                await asyncio.sleep(random.expovariate(rate))
                if time.perf_counter() >= end:
                    break
                tasks.append(asyncio.create_task(one_request(client, url, keys[name], max_tokens, results[name])))

        await asyncio.gather(*(arrivals(n, r) for n, r in rates.items()))
        await asyncio.gather(*tasks)
    return results


async def drive_one(url: str, key: str, max_tokens: int) -> list:
    out: list = []
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        await one_request(client, url, key, max_tokens, out)
    return out


ITL_METRIC = "tessera:inter_token_latency_seconds"
SPLIT_MS = (75, 100)  # ITL bucket bounds the worker's histogram has, to compare worker and client shares


def worker_itl_buckets(worker_url: str, priority: int) -> dict[float, float]:
    """Cumulative counts of the worker's ITL histogram for one priority (le -> count), from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(worker_url + "/metrics", timeout=10, trust_env=False).text
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == ITL_METRIC + "_bucket" and s.labels.get("priority") == str(priority):
                out[float(s.labels["le"])] = out.get(float(s.labels["le"]), 0.0) + s.value
    return out


def worker_vs_client_itl(before: dict[float, float], after: dict[float, float], rows: list) -> dict:
    """Share of premium token gaps within each SPLIT_MS bound, as the worker saw them (token reached
    its event loop) and as the client saw them (through the worker's SSE, the gateway and its own
    parsing): the difference is what the relay and the shared cores add."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    gaps = [g for r in rows if r["status"] == 200 for g in r.get("gaps", [])]
    out = {"worker_gaps": total, "client_gaps": len(gaps)}
    for ms in SPLIT_MS:
        le = ms / 1000
        within = after.get(le, 0.0) - before.get(le, 0.0)
        out[f"worker_within_{ms}ms"] = within / total if total else None
        out[f"client_within_{ms}ms"] = sum(1 for g in gaps if g <= ms) / len(gaps) if gaps else None
    return out


def summarize(results: dict[str, list], seconds: float) -> dict:
    targets = {name: (ttft, itl) for name, _, ttft, itl in TIERS}
    out = {}
    for name, rows in results.items():
        ok = [r for r in rows if r["status"] == 200 and r["ttft_ms"] is not None]
        ttft_t, itl_t = targets[name]
        ttfts = [r["ttft_ms"] for r in ok]
        gaps = [g for r in ok for g in r["gaps"]]
        good = [r for r in ok if r["ttft_ms"] <= ttft_t and (not r["gaps"] or sum(r["gaps"]) / len(r["gaps"]) <= itl_t)]
        shed = [r for r in rows if r["status"] == 429]
        out[name] = {
            "sent": len(rows), "completed": len(ok), "refused_429": len(shed),
            "refused_by": {c: sum(1 for r in shed if r["code"] == c) for c in sorted({r["code"] for r in shed})},
            "errors": sum(1 for r in rows if r["status"] not in (200, 429)),
            "errors_by": {f"{r['status']} {r['code']}": sum(1 for x in rows if (x["status"], x["code"]) == (r["status"], r["code"]))
                          for r in rows if r["status"] not in (200, 429)},
            "rate_429": len(shed) / len(rows) if rows else None,
            "ttft_p95_ms": percentile(ttfts, 95), "ttft_p50_ms": percentile(ttfts, 50),
            "itl_p95_ms": percentile(gaps, 95), "itl_p50_ms": percentile(gaps, 50), "goodput_rps": len(good) / seconds,
            "ttft_target_ms": ttft_t, "itl_target_ms": itl_t,
            "within_slo": bool(ttfts) and percentile(ttfts, 95) <= ttft_t and (not gaps or percentile(gaps, 95) <= itl_t),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="per load level")
    p.add_argument("--probe-seconds", type=float, default=10.0, help="per capacity probe rate")
    p.add_argument("--probe-rates", default="0.5,1,1.5,2,3,4,5,6,8,10,12",
                   help="premium-only rates tried for capacity (req/s)")
    p.add_argument("--levels", default="1,2,4", help="multiples of the measured capacity")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--floor-requests", type=int, default=12, help="premium requests one at a time (the floor)")
    p.add_argument("--capacity", type=float, default=None, help="skip the probe and use this rate (req/s)")
    p.add_argument("--capacity-slo", choices=("full", "ttft"), default="full",
                   help="what the premium-only probe must hold for a rate to count as capacity: the premium tier's "
                        "whole SLO (TTFT p95 and ITL p95; the rate the worker can serve within its promise) or "
                        "only TTFT p95 (the definition before 2026-11-23)")
    p.add_argument("--dtype", default="auto", help="the worker's --dtype (auto: bf16 only where the CPU has it natively)")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="an extra worker flag, e.g. --worker-arg=--itl-guard-seqs=1 (later flags win)")
    p.add_argument("--name", default="load", help="results file name (benchmarks/results/<name>.json/.md)")
    args = p.parse_args()
    WORKER_FLAGS.insert(0, f"--dtype={args.dtype}")
    WORKER_FLAGS.extend(args.worker_arg)
    random.seed(0)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "TESSERA_VAR_DIR": tmp,
               "DATABASE_URL": f"sqlite:///{tmp}/load.sqlite3", "TESSERA_LIMITER": "database", "REDIS_URL": "",
               "TESSERA_LOG_LEVEL": "WARNING", "TESSERA_WORKER_TOKEN": "", "TESSERA_SHED_QUEUE_DEPTH": GATEWAY_SHED,
               "TESSERA_WORKER_POLL_SECONDS": "0.5"}
        try:
            wport = free_port()
            worker_url = f"http://127.0.0.1:{wport}"
            procs.append(subprocess.Popen([sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port",
                                           str(wport), "--log-level", "warning", *WORKER_FLAGS], env=env, cwd=ROOT))
            keys = prepare(env)
            gport = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port",
                 str(gport), "--no-access-log", "--log-level", "warning"], cwd=ROOT,
                env={**env, "TESSERA_WORKERS": worker_url}))
            url = f"http://127.0.0.1:{gport}"
            wait_ready(worker_url, procs[0])
            wait_http(url + "/metrics")
            asyncio.run(drive(url, keys, {"premium": 1.0}, 3, args.max_tokens))  # warm-up
            # The floor: premium requests one at a time, nothing else running.
            floor_rows: list = []
            for _ in range(args.floor_requests):
                floor_rows += asyncio.run(drive_one(url, keys["premium"], args.max_tokens))
            floor = summarize({"premium": floor_rows}, 1.0)["premium"]
            print(f"floor (premium, one at a time): TTFT p95 {fmt(floor['ttft_p95_ms'], 0)} ms, "
                  f"ITL p50 / p95 {fmt(floor['itl_p50_ms'], 0)} / {fmt(floor['itl_p95_ms'], 0)} ms", flush=True)
            probes = []
            capacity = args.capacity
            if capacity is None:
                premium_ttft, premium_itl = TIERS[-1][2], TIERS[-1][3]
                for rate in (float(r) for r in args.probe_rates.split(",")):
                    s = summarize(asyncio.run(drive(url, keys, {"premium": rate}, args.probe_seconds, args.max_tokens)),
                                  args.probe_seconds)["premium"]
                    probes.append({"rate_rps": rate, **s})
                    print(f"probe {rate} req/s: TTFT p95 {fmt(s['ttft_p95_ms'], 0)} ms, ITL p95 "
                          f"{fmt(s['itl_p95_ms'], 0)} ms, 429 {s['refused_429']}", flush=True)
                    if s["ttft_p95_ms"] is None or s["ttft_p95_ms"] > premium_ttft or s["refused_429"]:
                        break
                    if args.capacity_slo == "full" and (s["itl_p95_ms"] or 0) > premium_itl:
                        break
                    capacity = rate
                capacity = capacity or float(args.probe_rates.split(",")[0])
            levels = []
            for level in (float(x) for x in args.levels.split(",")):
                total = level * capacity
                rates = {name: total / len(TIERS) for name, *_ in TIERS}
                before = worker_itl_buckets(worker_url, TIERS[-1][1])
                raw = asyncio.run(drive(url, keys, rates, args.seconds, args.max_tokens))
                split = worker_vs_client_itl(before, worker_itl_buckets(worker_url, TIERS[-1][1]), raw["premium"])
                summary = summarize(raw, args.seconds)
                levels.append({"level": level, "offered_rps": total, "tiers": summary, "premium_itl_split": split})
                print(f"{level:g}x ({total:.2f} req/s): " + "; ".join(
                    f"{n} TTFT p95 {fmt(s['ttft_p95_ms'], 0)} ms, 429 {fmt((s['rate_429'] or 0) * 100, 0)}%"
                    for n, s in summary.items()), flush=True)
        finally:
            stop_processes(procs, 20)
    data = {"environment": environment(), "model": MODEL, "worker_flags": WORKER_FLAGS, "gateway_shed": GATEWAY_SHED,
            "max_tokens": args.max_tokens, "seconds_per_level": args.seconds, "capacity_rps": capacity,
            "capacity_slo": "given" if args.capacity else args.capacity_slo,
            "floor": floor, "capacity_probes": probes, "levels": levels}
    write_results(args.name, data, table(data))


CAPACITY_MEANING = {
    "full": "the highest premium-only rate whose TTFT p95 and ITL p95 both stay within the premium SLO",
    "ttft": "the highest premium-only rate whose TTFT p95 stays within 1000 ms",
    "given": "given with --capacity",
}


def errors(s: dict) -> str:
    detail = ", ".join(f"{n}× {code}" for code, n in sorted(s.get("errors_by", {}).items()))
    return f"{s['errors']} ({detail})" if detail else str(s["errors"])


def ratio(value: float | None, floor: float | None) -> str:
    return f"{value / floor:.2f}×" if value and floor else "–"


def table(data: dict) -> str:
    lines = [
        "# Load: per-tier SLOs under overload (`python -m benchmarks.load`)", "",
        f"One SmolLM2-135M worker ({' '.join(data['worker_flags'])}) behind the gateway (shed depths "
        f"`{data['gateway_shed']}`), {data['max_tokens']} streamed tokens per request, Poisson arrivals split evenly "
        f"over three tenants. Capacity ({CAPACITY_MEANING[data['capacity_slo']]}): "
        f"**{fmt(data['capacity_rps'], 2)} req/s**. {data['seconds_per_level']:g} s per level; 2 shared CPU cores.", "",
        f"Floor (premium requests one at a time through the same stack): TTFT p95 "
        f"{fmt(data['floor']['ttft_p95_ms'], 0)} ms, ITL p50 / p95 {fmt(data['floor']['itl_p50_ms'], 0)} / "
        f"{fmt(data['floor']['itl_p95_ms'], 0)} ms: no load can bring a tier's ITL below it; the `ITL vs floor` "
        f"column shows what load adds.", "",
        "| load | tier | sent | done | 429 (gateway / worker) | errors | TTFT p50 / p95 ms (target) | ITL p95 ms (target) | ITL p95 vs floor | goodput req/s | within SLO |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in data["levels"]:
        for name, s in lv["tiers"].items():
            gw = s["refused_by"].get("overloaded", 0)
            wk = s["refused_429"] - gw
            lines.append(
                f"| {lv['level']:g}× ({lv['offered_rps']:.2f}/s) | {name} | {s['sent']} | {s['completed']} | "
                f"{s['refused_429']} ({gw} / {wk}), {fmt((s['rate_429'] or 0) * 100, 0)}% | {errors(s)} | "
                f"{fmt(s['ttft_p50_ms'], 0)} / {fmt(s['ttft_p95_ms'], 0)} ({s['ttft_target_ms']}) | "
                f"{fmt(s['itl_p95_ms'], 0)} ({s['itl_target_ms']}) | {ratio(s['itl_p95_ms'], data['floor']['itl_p95_ms'])} | "
                f"{fmt(s['goodput_rps'], 2)} | "
                f"{'yes' if s['within_slo'] else 'no'} |")
    lines += ["", "Premium token gaps within 75 / 100 ms, as the worker saw them (the token reaching its event loop) "
              "and as the client saw them (after the worker's SSE, the gateway and the client's own parsing):", "",
              "| load | worker ≤ 75 ms | client ≤ 75 ms | worker ≤ 100 ms | client ≤ 100 ms |", "|---|---:|---:|---:|---:|"]
    for lv in data["levels"]:
        sp = lv.get("premium_itl_split")
        if sp:
            pct = [fmt((sp[k] or 0) * 100, 1) + "%" for k in ("worker_within_75ms", "client_within_75ms",
                                                             "worker_within_100ms", "client_within_100ms")]
            lines.append(f"| {lv['level']:g}× | " + " | ".join(pct) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
