"""`benchmarks.routing --gateways 1,2,3`: the same schedule through 1, 2 and 3 real gateway processes.

Each gateway is a uvicorn process serving controlplane.asgi (auth, the Redis limiter, routing,
metering), all in front of the same real workers, sharing one SQLite database (tenants, keys, ledger)
and one Redis namespace: the shared routing table (controlplane/gateway/routing/shared_prefixes.py) is on,
as it is by default when REDIS_URL is set. The client sends each request to the next gateway in turn
(round-robin, a load balancer with no affinity), so with N gateways a tenant's next turn reaches
another gateway than its last one (N-1)/N of the time. `--unshared` adds a pass through the most
gateways with TESSERA_ROUTING_SHARED=0: what each gateway's own table alone gets.

Every gateway count gets the same schedule and texts (routing.workload), with tenants of its own
(another cache salt), so no pass finds another's blocks cached. Reported per pass: prefix-hit rate
(cached / prompt tokens, the workers' counts relayed by the gateway) and TTFT (client side, to the
first content token), and both as ratios to one gateway. This module imports nothing from
benchmarks.routing (which calls it): the workload comes in as arguments.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from benchmarks.common import db_step, fmt, percentile, read_chat_stream
from benchmarks.gateway import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent
REDIS = "redis://127.0.0.1:6379/0"


@dataclass(slots=True)
class Sent:
    gateway: int
    ttft: float
    done: float  # seconds since the pass began
    prompt_tokens: int
    cached_tokens: int
    status: int


@dataclass(frozen=True, slots=True)
class Setup:
    name: str  # "1", "2", "3", "3-unshared"
    gateways: int
    shared: bool


def setups(counts: list[int], unshared: bool) -> list[Setup]:
    out = [Setup(str(n), n, True) for n in counts]
    return out + ([Setup(f"{max(counts)}-unshared", max(counts), False)] if unshared else [])


def prepare(env: dict[str, str], model: str, names: list[str], tenants: int) -> dict[str, list[str]]:
    """Migrate the shared database, price the model, and make `tenants` tenants (own salt, own key) per
    pass name, on an unlimited tier; returns their keys by pass name."""
    return db_step(env, "routing_tenants", model=model, names=names, tenants=tenants)


def start_gateways(n: int, shared: bool, base_env: dict[str, str], procs: list) -> list[str]:
    env = {**base_env, "TESSERA_ROUTING_SHARED": "1" if shared else "0"}
    urls = []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port",
             str(port), "--no-access-log", "--log-level", "warning"], cwd=ROOT, env=env))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(f"{url}/v1/models")
    return urls


async def send(client: httpx.AsyncClient, gateways: list[str], turn: itertools.count, secret: str, model: str,
               messages: list[dict], max_tokens: int, began: float) -> tuple[Sent, str]:
    index = next(turn) % len(gateways)  # the load balancer: round-robin, no affinity
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    sent = time.perf_counter()
    first, text, usage, status = None, "", {}, 0
    async with client.stream("POST", gateways[index] + "/v1/chat/completions", content=orjson.dumps(body),
                             headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}) as r:
        status = r.status_code
        if status != 200:
            await r.aread()
            raise RuntimeError(f"gateway {index}: {status} {r.text[:300]}")
        first, text, usage = await read_chat_stream(r)
    now = time.perf_counter()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Sent(index, (first or now) - sent, now - began, usage.get("prompt_tokens", 0), cached, status), text


async def run_pass(gateways: list[str], secrets: list[str], systems: list[str], convs, args, model: str
                   ) -> tuple[list[Sent], float]:
    turn = itertools.count()
    results: list[Sent] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits, trust_env=False) as client:
        # Steady state, as in the one-gateway benchmark: each tenant seen once, not measured.
        for tenant in sorted({c.tenant for c in convs}):
            messages = [{"role": "system", "content": systems[tenant]}, {"role": "user", "content": "Hello"}]
            await send(client, gateways, turn, secrets[tenant], model, messages, 1, time.perf_counter())
        began = time.perf_counter()

        async def converse(conv) -> None:
            await asyncio.sleep(conv.start)
            messages = [{"role": "system", "content": systems[conv.tenant]}]
            for q in conv.questions:
                messages.append({"role": "user", "content": q})
                result, answer = await send(client, gateways, turn, secrets[conv.tenant], model, messages,
                                            args.max_tokens, began)
                results.append(result)
                messages.append({"role": "assistant", "content": answer})
                await asyncio.sleep(args.think)

        await asyncio.gather(*(converse(c) for c in convs))
    return results, max(r.done for r in results)


def summarize(setup: Setup, passes: list[tuple[list[Sent], float]]) -> dict:
    results = [r for rs, _ in passes for r in rs]
    elapsed = sum(e for _, e in passes)
    prompt, cached = sum(r.prompt_tokens for r in results), sum(r.cached_tokens for r in results)
    ttft = [r.ttft for r in results]
    return {"setup": setup.name, "gateways": setup.gateways, "shared": setup.shared, "requests": len(results),
            "prefix_hit_rate": cached / max(prompt, 1), "ttft_p50_ms": percentile(ttft, 50) * 1e3,
            "ttft_p95_ms": percentile(ttft, 95) * 1e3, "req_s": len(results) / elapsed, "seconds": elapsed,
            "passes": [{"ttft_p95_ms": percentile([r.ttft for r in rs], 95) * 1e3,
                        "hit_rate": sum(r.cached_tokens for r in rs) / max(sum(r.prompt_tokens for r in rs), 1)}
                       for rs, _ in passes],
            "requests_per_gateway": [sum(1 for r in results if r.gateway == g) for g in range(setup.gateways)]}


def run(args, systems: list[str], convs, worker_urls: list[str], model: str, tmp: str) -> list[dict]:
    """Every setup, `args.rounds` passes each in rotated order; the rows of the table."""
    counts = [int(n) for n in args.gateways.split(",")]
    plan = setups(counts, args.unshared)
    namespace = f"tsrbench-routing-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "TESSERA_VAR_DIR": tmp,
           "DATABASE_URL": f"sqlite:///{tmp}/gateways.sqlite3", "TESSERA_WORKERS": ",".join(worker_urls),
           "TESSERA_WORKER_TOKEN": "", "TESSERA_LIMITER": "redis", "REDIS_URL": REDIS,
           "TESSERA_REDIS_PREFIX": namespace, "TESSERA_WORKER_POLL_SECONDS": "0.5", "TESSERA_LOG_LEVEL": "WARNING"}
    names = [f"{s.name}-{r}" for s in plan for r in range(args.rounds)]
    keys = prepare(env, model, names, args.tenants)
    procs: list[subprocess.Popen] = []
    passes: dict[str, list] = {s.name: [] for s in plan}
    try:
        by_sharing = {shared: start_gateways(max(s.gateways for s in plan if s.shared == shared), shared, env, procs)
                      for shared in {s.shared for s in plan}}
        for r in range(args.rounds):
            for setup in plan[r % len(plan):] + plan[:r % len(plan)]:  # rotated: the host's load drifts
                gateways = by_sharing[setup.shared][:setup.gateways]
                results, elapsed = asyncio.run(run_pass(gateways, keys[f"{setup.name}-{r}"], systems, convs, args,
                                                        model))
                passes[setup.name].append((results, elapsed))
                print(f"round {r} gateways {setup.name}: TTFT p95 {percentile([x.ttft for x in results], 95) * 1e3:.0f}"
                      f" ms, hits {sum(x.cached_tokens for x in results) / max(sum(x.prompt_tokens for x in results), 1):.0%}",
                      flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        _forget(namespace)
    return [summarize(s, passes[s.name]) for s in plan]


def _forget(namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)
    client.close()


def avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def per_pass(row: dict) -> str:
    return " / ".join(f"{p['ttft_p95_ms']:.0f}" for p in row["passes"])


def table(rows: list[dict], args, flags: list[str], env: dict) -> str:
    one = next(r for r in rows if r["gateways"] == 1 and r["shared"])
    lines = ["| gateways | shared table | requests | prefix-hit rate | vs 1 gateway | TTFT p50 / p95 ms | TTFT p95 vs 1 "
             "gateway | TTFT p95 per pass ms | req/s | requests per gateway |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    verdicts = []
    for r in rows:
        hit, p95 = r["prefix_hit_rate"] / max(one["prefix_hit_rate"], 1e-9), r["ttft_p95_ms"] / one["ttft_p95_ms"]
        lines.append(f"| {r['gateways']} | {'yes' if r['shared'] else 'no'} | {r['requests']} | "
                     f"{r['prefix_hit_rate']:.0%} | {hit:.2f}× | {fmt(r['ttft_p50_ms'], 0)} / {fmt(r['ttft_p95_ms'], 0)} | "
                     f"{p95:.2f}× | {per_pass(r)} | {fmt(r['req_s'], 2)} | "
                     f"{'/'.join(map(str, r['requests_per_gateway']))} |")
        if r["shared"] and r["gateways"] > 1:
            met = hit >= 0.9 and p95 <= 1.1
            verdicts.append(f"{r['gateways']} gateways: hit rate {hit:.2f}×, TTFT p95 {p95:.2f}× of one gateway's: "
                            f"**{'met' if met else 'not met'}**")
    return "\n".join([
        f"# Routing through {', '.join(r['setup'] for r in rows)} gateway processes (`python -m benchmarks.routing "
        f"--gateways {args.gateways}{' --unshared' if args.unshared else ''}`)", "",
        f"{args.workers} SmolLM2-135M workers ({' '.join(flags)}) behind N real gateway processes (uvicorn, "
        "controlplane.asgi: auth, Redis limiter, cache-aware routing with the shared table in Redis, metering; one "
        "SQLite database), the client sending each request to the next gateway in turn (round-robin). "
        f"{args.tenants} tenants with their own ~{args.system_words}-word system prompt, {args.users} users each, "
        f"{args.turns}-turn chats starting at {args.rate}/s (Poisson, seed {args.seed}), {args.max_tokens}-token "
        f"answers, {args.think} s between turns; one unmeasured request per tenant first. Passes per setup: "
        f"{args.rounds}, order rotated each round; each pass with tenants of its own.", "", *lines, "",
        "Target (issue 29, part 5: prefix-hit rate and TTFT p95 within 10 % of one gateway): "
        + "; ".join(verdicts) + ".", "",
        f"Load average (1 min) at the start / end: {args.load_before:.1f} / {args.load_after:.1f}. CPU: {env['cpu']} "
        f"(avx512_bf16 flag: {'yes' if avx512_bf16() else 'no'}), torch {env['torch']}, {env['when']}. "
        "The 2 cores are shared by the workers, the gateways and the load generator: compare within a run."])
