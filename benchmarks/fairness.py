"""Fair sharing between two tenants of one tier, first come first served against VTC (issue 18).

    python -m benchmarks.fairness [--seconds 40] [--flood 48] [--small-every 1.0]

For each scheduler (the worker's --no-fair-share, then its default --fair-share) a fresh SmolLM2-135M
worker is started on a free port and driven directly with the gateway's headers (X-Tenant-Id,
X-Priority 10 for both, a salt per tenant):

- the big tenant keeps `--flood` streamed chat requests in the worker at all times (a closed loop: each
  finished request is replaced at once), so dozens of its requests are always queued;
- the small tenant sends one request every `--small-every` seconds for `--seconds` seconds.

Reported per scheduler: the small tenant's TTFT p50 / p95 / max (client side, first content token),
the big tenant's TTFT p50 and both tenants' completed requests and output tokens per second (what
fairness costs the flood and the whole engine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.common import environment, fmt, percentile, read_chat_stream, ttft_and_gaps, write_results
from benchmarks.gateway import free_port
from benchmarks.serve_client import wait_ready

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
WORKER_FLAGS = ["--kv-cache-memory=256MiB", "--max-num-seqs=8", "--max-num-batched-tokens=256", "--threads=1",
                "--max-waiting=256"]
PRIORITY = 10  # one tier: fairness orders within it


async def one_request(client: httpx.AsyncClient, url: str, tenant: str, max_tokens: int, out: list) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Write a note about request {random.random():.6f}."}]}
    headers = {"X-Tenant-Id": tenant, "X-Priority": str(PRIORITY), "X-Cache-Salt": f"salt-{tenant}"}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                out.append({"status": r.status_code, "body": (await r.aread())[:200].decode(errors="replace")})
                return
            await read_chat_stream(r, arrivals)
        ttft, gaps = ttft_and_gaps(t0, arrivals)
        out.append({"status": 200, "ttft_ms": ttft, "tokens": len(arrivals), "gaps": gaps, "start": t0,
                    "end": time.perf_counter()})
    except httpx.HTTPError as exc:
        out.append({"status": 0, "body": type(exc).__name__})


async def scenario(url: str, args: argparse.Namespace) -> dict:
    big: list = []
    small: list = []
    limits = httpx.Limits(max_connections=args.flood + 64, max_keepalive_connections=args.flood + 64)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as client:
        stop = asyncio.Event()

        async def flood_client() -> None:
            while not stop.is_set():
                await one_request(client, url, "big", args.big_tokens, big)

        flooders = [asyncio.create_task(flood_client()) for _ in range(args.flood)]
        await asyncio.sleep(args.settle)  # the queue fills before the small tenant starts
        load_start = os.getloadavg()[0]
        t_start = time.perf_counter()
        smalls = []
        while time.perf_counter() - t_start < args.seconds:
            smalls.append(asyncio.create_task(one_request(client, url, "small", args.small_tokens, small)))
            await asyncio.sleep(args.small_every)
        await asyncio.gather(*smalls)
        t_end = time.perf_counter()
        load_end = os.getloadavg()[0]
        stop.set()
        for f in flooders:
            f.cancel()  # in-flight flood requests are aborted (the client leaves)
        await asyncio.gather(*flooders, return_exceptions=True)
    window = t_end - t_start

    def served(rows: list) -> list:
        return [r for r in rows if r["status"] == 200 and t_start <= r["end"] <= t_end]

    small_ttft = [r["ttft_ms"] for r in small if r["status"] == 200 and r["ttft_ms"] is not None]
    big_ttft = [r["ttft_ms"] for r in served(big) if r["ttft_ms"] is not None]
    return {
        "window_s": window,
        "small_sent": len(small), "small_done": len(small_ttft),
        "small_errors": [r for r in small if r["status"] != 200][:3],
        "small_ttft_p50_ms": percentile(small_ttft, 50), "small_ttft_p95_ms": percentile(small_ttft, 95),
        "small_ttft_max_ms": max(small_ttft, default=None),
        "big_done": len(served(big)), "big_ttft_p50_ms": percentile(big_ttft, 50),
        # a step's time, as the flood's token gaps show it: the host's speed in this window
        "big_itl_p50_ms": percentile([g for r in served(big) for g in r["gaps"]], 50),
        "load_average": [load_start, load_end],
        "big_tokens_per_s": sum(r["tokens"] for r in served(big)) / window,
        "small_tokens_per_s": sum(r["tokens"] for r in served(small)) / window,
        "big_errors": [r for r in big if r["status"] not in (200, 0)][:3],
    }


def run_worker(args: argparse.Namespace, fair: bool) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TESSERA_WORKER_TOKEN": ""}
    flags = [*WORKER_FLAGS, "--fair-share" if fair else "--no-fair-share"]
    proc = subprocess.Popen([sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port", str(port),
                             "--log-level", "warning", *flags], env=env, cwd=ROOT)
    try:
        wait_ready(url, proc)
        asyncio.run(scenario_warmup(url))
        result = asyncio.run(scenario(url, args))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result["worker_flags"] = flags
    return result


async def scenario_warmup(url: str) -> None:
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        await one_request(client, url, "warmup", 4, [])


def replay(args: argparse.Namespace, fair: bool, steps: int = 600, prompt: int = 40) -> dict:
    """The same workload through the scheduler alone (no model, no clock): what each scheduler puts in a
    step, independent of how fast the host runs it. Steps are 150 ms apart for aging; the small tenant
    arrives every `small_every` / 0.15 s steps."""
    from dataplane.config import SchedulerConfig
    from dataplane.kv_cache.manager import KVCacheManager
    from dataplane.request import Request
    from dataplane.sampling_params import SamplingParams
    from dataplane.scheduler.fairness import assign_tenant
    from dataplane.scheduler.output import ModelRunnerOutput
    from dataplane.scheduler.scheduler import Scheduler

    now = [0.0]
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, fair_share=fair),
                      KVCacheManager(4096, 16, True), 2048, clock=lambda: now[0])
    count, arrived, waits, step = 0, {}, [], 0

    def add(tenant: str, max_tokens: int) -> None:
        nonlocal count
        count += 1
        req = Request(f"{tenant}-{count}", [(count * 31 + i) % 30000 for i in range(prompt)],
                      SamplingParams(max_tokens=max_tokens, ignore_eos=True), (), PRIORITY, f"salt-{tenant}")
        req.times.arrival = now[0]
        assign_tenant([req], tenant)
        sched.add_request(req)
        if tenant == "small":
            arrived[req.request_id] = step

    for _ in range(args.flood):
        add("big", args.big_tokens)
    every = max(1, round(args.small_every / 0.15))
    tokens = 0
    for step in range(steps):  # add() reads `step`
        if step % every == 0:
            add("small", args.small_tokens)
        out = sched.schedule()
        result = ModelRunnerOutput()
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            if req.num_computed_tokens + n == req.num_tokens:
                result.sampled_token_ids[rid] = [7]
        for r in out.new_requests:
            if r.request_id in arrived:
                waits.append(step - arrived.pop(r.request_id))
        for o in sched.update(out, result):
            if o.finish_reason and o.request_id.startswith("big"):
                add("big", args.big_tokens)
        tokens += out.total_num_scheduled_tokens
        now[0] += 0.15
    return {"tokens_per_step": tokens / steps, "small_wait_steps_p95": percentile(waits, 95)}


def table(data: dict) -> str:
    a = data["args"]
    lines = [
        "# Fair sharing between tenants of one tier: FCFS against VTC",
        "",
        f"`python -m benchmarks.fairness --seconds {a['seconds']} --flood {a['flood']} --small-every {a['small_every']}`"
        f" — {host(data)}, {data['environment']['when'][:10]}. The machine's cores were shared with other work "
        "during the run (other tests and benchmarks; see the load average), so absolute times are noisy; the two "
        "schedulers ran back to back.",
        "",
        f"One SmolLM2-135M worker ({' '.join(WORKER_FLAGS)}), driven directly with the gateway's headers. Both "
        f"tenants are on one tier (X-Priority {PRIORITY}). The big tenant keeps {a['flood']} streamed requests of "
        f"{a['big_tokens']} tokens in the worker (closed loop); the small tenant sends a {a['small_tokens']}-token "
        f"request every {a['small_every']} s for {a['seconds']} s.",
        "",
        "| scheduler | small: sent / done | small TTFT p50 / p95 / max ms | big TTFT p50 ms | big done | "
        "big tok/s | small tok/s | big ITL p50 ms (step time) | load average | replay: tokens / step | "
        "replay: small wait p95 (steps) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in data["results"].items():
        lines.append(
            f"| {name} | {r['small_sent']} / {r['small_done']} | {fmt(r['small_ttft_p50_ms'], 0)} / "
            f"{fmt(r['small_ttft_p95_ms'], 0)} / {fmt(r['small_ttft_max_ms'], 0)} | {fmt(r['big_ttft_p50_ms'], 0)} | "
            f"{r['big_done']} | {fmt(r['big_tokens_per_s'], 1)} | {fmt(r['small_tokens_per_s'], 1)} | "
            f"{fmt(r['big_itl_p50_ms'], 0)} | {fmt(r['load_average'][0], 1)} → {fmt(r['load_average'][1], 1)} | "
            f"{fmt(r['replay']['tokens_per_step'], 1)} | {fmt(r['replay']['small_wait_steps_p95'], 0)} |")
    lines += ["", "*Replay*: the same workload through the scheduler alone, with no model and no clock (what "
                  "each scheduler puts in a step, whatever the host's speed): tokens per step say whether "
                  "fairness costs batch size; the wait is in steps. Throughput in tok/s also moves with the host's "
                  "speed in each window (the step-time column)."]
    f, v = data["results"]["fcfs"], data["results"]["fair (VTC)"]
    both = [r["big_tokens_per_s"] + r["small_tokens_per_s"] for r in (f, v)]
    lines += ["", f"Both tenants together: {fmt(both[0], 1)} tok/s under FCFS, {fmt(both[1], 1)} under fair sharing; "
                  f"the flood's TTFT p50 {fmt(f['big_ttft_p50_ms'], 0)} against {fmt(v['big_ttft_p50_ms'], 0)} ms."]
    if f["small_ttft_p95_ms"] and v["small_ttft_p95_ms"]:
        lines += ["", f"Small tenant's TTFT p95: {fmt(f['small_ttft_p95_ms'] / v['small_ttft_p95_ms'], 1)}× lower "
                      "with fair sharing. Under FCFS each small request waits behind the whole flood queued before "
                      "it; under VTC it takes the next seat that frees (its counter is lifted to the big tenant's "
                      "on arrival and the big tenant's grows with every token it is served)."]
    return "\n".join(lines)


def host(data: dict) -> str:
    env = data["environment"]
    bf16 = ", native bf16" if env.get("native_bf16") else ""
    return f"{env['cpu']} ({env['cpu_capability']}{bf16}), {data.get('cores', '?')} cores"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=40, help="how long the small tenant sends")
    p.add_argument("--flood", type=int, default=48, help="the big tenant's requests kept in the worker")
    p.add_argument("--small-every", type=float, default=1.0, help="seconds between the small tenant's requests")
    p.add_argument("--big-tokens", type=int, default=16)
    p.add_argument("--small-tokens", type=int, default=8)
    p.add_argument("--settle", type=float, default=5.0, help="seconds the flood runs before the small tenant starts")
    p.add_argument("--name", default="fairness", help="results file name (benchmarks/results/<name>.json/.md)")
    args = p.parse_args()
    random.seed(0)
    results = {}
    for name, fair in (("fcfs", False), ("fair (VTC)", True)):
        results[name] = run_worker(args, fair)
        results[name]["replay"] = replay(args, fair)
        r = results[name]
        print(f"{name}: small TTFT p50 / p95 {fmt(r['small_ttft_p50_ms'], 0)} / {fmt(r['small_ttft_p95_ms'], 0)} ms "
              f"({r['small_done']}/{r['small_sent']}), big {r['big_done']} done, {fmt(r['big_tokens_per_s'], 1)} tok/s",
              flush=True)
    data = {"environment": environment(), "cores": os.cpu_count(), "model": MODEL, "args": vars(args),
            "results": results}
    jpath, mpath = write_results(args.name, data, table(data))
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
