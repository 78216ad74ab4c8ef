"""Routing policies across real workers: round-robin, least-loaded, (affinity,) cache-aware, in one run.

    python -m benchmarks.routing [--workers 3] [--tenants 6] [--users 2] [--turns 3] [--rate 0.15] [--rounds 1]
    python -m benchmarks.routing --gateways 1,2,3 [--unshared]    # through real gateway processes

Starts `--workers` SmolLM2-135M workers (one torch thread each, a small KV cache so they cannot all
hold every tenant's prefix) and drives them with the gateway's own routing code
(controlplane.gateway.routing.workers.Registry.pick and prefix_routing, the registry polling /ready for
queue depths) from this process, without the rest of the gateway (auth, limits, metering: the
same for every policy, and CPU this 2-core host cannot spare).

Workload: `--tenants` tenants, each with its own long system prompt (~420 tokens) shared by its
`--users` users; each user holds a `--turns`-turn chat (short questions, `--max-tokens` answers
appended to the history), starting at Poisson times (`--rate` conversations/s), a second of
thinking between turns. Before the measured schedule each tenant sends one unmeasured request (a
platform in steady state has seen its tenants before), routed by the policy under test. Every
policy gets the same schedule and texts; its tenants' cache salts carry the policy's name, so no
phase finds another's blocks cached.

Per policy: prefix-hit rate (cached / prompt tokens, the workers' own counts), TTFT p50/p95 (client
side, to the first content token), output tokens/s and requests/s over the phase (the schedule is
open-loop per conversation, so equal requests/s means every policy kept up with it). `--rounds N`
repeats the passes in rotated order and pools them. The CPU is shared with other work: compare
within one run.

`--gateways 1,2,3` measures something else with the same workers and schedule: cache-aware routing
through 1, 2 and 3 real gateway processes sharing their routing table in Redis, the client
round-robining over them (benchmarks/routing_gateways.py; results in routing_gateways.{json,md}).
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
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from benchmarks import routing_gateways
from benchmarks.common import environment, fmt, percentile, read_chat_stream, write_results
from benchmarks.gateway import free_port
from benchmarks.serve_client import wait_ready

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
POLICIES = ("round_robin", "least_loaded", "cache_aware")
WORDS = ("order shipping refund invoice account password delivery warranty battery screen cable charger "
         "helmet brake tire pedal chain saddle frame wheel gear policy store customer support reply "
         "polite brief always never include mention contact hours weekend holiday return exchange").split()


@dataclass(slots=True)
class Result:
    tenant: int
    turn: int
    worker: str
    ttft: float
    done: float  # seconds since the phase began
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def system_prompt(rng: random.Random, tenant: int, words: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"You are the assistant of shop number {tenant}. Rules: {body}."


def question(rng: random.Random) -> str:
    return "Question: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 24))) + "?"


@dataclass(slots=True)
class Conversation:
    tenant: int
    start: float  # seconds after the phase begins
    questions: list[str]


def workload(args: argparse.Namespace) -> tuple[list[str], list[Conversation]]:
    rng = random.Random(args.seed)
    systems = [system_prompt(rng, t, args.system_words) for t in range(args.tenants)]
    tenants = [t for t in range(args.tenants) for _ in range(args.users)]
    rng.shuffle(tenants)
    convs, t = [], 0.0
    for tenant in tenants:
        t += rng.expovariate(args.rate)
        convs.append(Conversation(tenant, t, [question(rng) for _ in range(args.turns)]))
    return systems, convs


async def one_request(client: httpx.AsyncClient, registry, salt: str, messages: list[dict], max_tokens: int,
                      began: float) -> tuple[Result | None, str]:
    from controlplane.gateway.parsing import affinity_key, parse
    from controlplane.gateway.routing.prefix_routing import prefix_key, prompt_text

    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    raw = orjson.dumps(body)
    parsed = parse(raw, "chat")
    worker = registry.pick(MODEL, affinity_key(parsed, salt),
                           prefix=prefix_key(prompt_text("chat", parsed.body), salt, MODEL))
    worker.outstanding += 1
    sent = time.perf_counter()
    first, text, usage = None, "", {}
    try:
        async with client.stream("POST", worker.url + "/v1/chat/completions", content=raw,
                                 headers={"Content-Type": "application/json", "X-Cache-Salt": salt}) as response:
            response.raise_for_status()
            first, text, usage = await read_chat_stream(response)
    finally:
        worker.outstanding -= 1
    now = time.perf_counter()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    result = Result(-1, -1, worker.url, (first or now) - sent, now - began, usage.get("prompt_tokens", 0), cached,
                    usage.get("completion_tokens", 0))
    return result, text


async def run_phase(policy: str, tag: str, urls: list[str], systems: list[str], convs: list[Conversation],
                    args: argparse.Namespace) -> tuple[list[Result], float]:
    """One pass of the schedule under `policy`; `tag` goes into the salts, so no pass finds another's
    blocks cached."""
    from controlplane.gateway.routing.workers import Registry

    registry = Registry(urls)
    registry.policy = policy
    await registry.refresh()

    async def poll() -> None:
        while True:
            await asyncio.sleep(0.5)
            await registry.refresh()

    poller = asyncio.create_task(poll())
    results: list[Result] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits, trust_env=False) as client:
        # Steady state, not a cold start: each tenant has been seen once (a platform runs for days, a
        # tenant's first request ever is rare), routed by the policy under test and not measured.
        for tenant in sorted({c.tenant for c in convs}):
            messages = [{"role": "system", "content": systems[tenant]}, {"role": "user", "content": "Hello"}]
            await one_request(client, registry, f"tenant-{tenant}-{tag}", messages, 1, time.perf_counter())
        began = time.perf_counter()

        async def converse(conv: Conversation, index: int) -> None:
            await asyncio.sleep(conv.start)
            salt = f"tenant-{conv.tenant}-{tag}"
            messages = [{"role": "system", "content": systems[conv.tenant]}]
            for turn, q in enumerate(conv.questions):
                messages.append({"role": "user", "content": q})
                result, answer = await one_request(client, registry, salt, messages, args.max_tokens, began)
                result.tenant, result.turn = conv.tenant, turn
                results.append(result)
                messages.append({"role": "assistant", "content": answer})
                await asyncio.sleep(args.think)

        await asyncio.gather(*(converse(c, i) for i, c in enumerate(convs)))
        elapsed = max(r.done for r in results)
    poller.cancel()
    return results, elapsed


def summarize(policy: str, passes: list[tuple[list[Result], float]], urls: list[str]) -> dict:
    """Pooled over the policy's passes: TTFT percentiles of every request, throughput over their total time."""
    results = [r for rs, _ in passes for r in rs]
    elapsed = sum(e for _, e in passes)
    ttft = [r.ttft for r in results]
    prompt, cached = sum(r.prompt_tokens for r in results), sum(r.cached_tokens for r in results)
    out = sum(r.completion_tokens for r in results)
    per_worker = {u: sum(1 for r in results if r.worker == u) for u in urls}
    return {"policy": policy, "requests": len(results), "seconds": elapsed, "prefix_hit_rate": cached / max(prompt, 1),
            "passes": [{"seconds": e, "ttft_p95_ms": percentile([r.ttft for r in rs], 95) * 1e3,
                        "hit_rate": sum(r.cached_tokens for r in rs) / max(sum(r.prompt_tokens for r in rs), 1)}
                       for rs, e in passes],
            "prompt_tokens": prompt, "cached_tokens": cached, "output_tokens": out, "tok_s": out / elapsed,
            "req_s": len(results) / elapsed, "ttft_p50_ms": percentile(ttft, 50) * 1e3,
            "ttft_p95_ms": percentile(ttft, 95) * 1e3, "requests_per_worker": list(per_worker.values())}


def start_workers(n: int, flags: list[str], env: dict) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port", str(port),
                                       "--log-level", "warning", *flags], env=env, cwd=ROOT))
        urls.append(f"http://127.0.0.1:{port}")
    for proc, url in zip(procs, urls, strict=True):
        wait_ready(url, proc)
    return procs, urls


def per_pass(row: dict) -> str:
    return " / ".join(f"{p['ttft_p95_ms']:.0f}" for p in row["passes"])


def table(rows: list[dict], args: argparse.Namespace, flags: list[str], env: dict) -> str:
    base = next((r for r in rows if r["policy"] == "round_robin"), rows[0])
    lines = ["| policy | requests | prefix-hit rate | TTFT p50 / p95 ms | TTFT p95 vs round-robin | TTFT p95 per pass ms "
             "| output tok/s | req/s | requests per worker |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['requests']} | {r['prefix_hit_rate']:.0%} | {fmt(r['ttft_p50_ms'], 0)} / "
                     f"{fmt(r['ttft_p95_ms'], 0)} | {r['ttft_p95_ms'] / base['ttft_p95_ms']:.2f}× | "
                     f"{per_pass(r)} | {fmt(r['tok_s'])} | "
                     f"{fmt(r['req_s'], 2)} | {'/'.join(map(str, r['requests_per_worker']))} |")
    verdict = ""
    cache = next((r for r in rows if r["policy"] == "cache_aware"), None)
    if cache is not None and base["policy"] == "round_robin":
        ratio, speed = cache["ttft_p95_ms"] / base["ttft_p95_ms"], cache["req_s"] / base["req_s"]
        met = ratio <= 0.6 and speed >= 0.9
        verdict = (f"Target (cache-aware TTFT p95 ≤ 0.6× round-robin's at equal throughput): {ratio:.2f}× at "
                   f"{speed:.2f}× the requests/s: **{'met' if met else 'not met'}**.")
    return "\n".join([
        f"# Routing: {' vs '.join(r['policy'] for r in rows)} (`python -m benchmarks.routing`)", "",
        f"{args.workers} SmolLM2-135M workers ({' '.join(flags)}); {args.tenants} tenants with their own "
        f"~{args.system_words}-word system prompt, {args.users} users each, {args.turns}-turn chats, conversations "
        f"starting at {args.rate}/s (Poisson, seed {args.seed}), {args.max_tokens}-token answers (ignore_eos), "
        f"{args.think} s between turns; one unmeasured request per tenant first (steady state). Routed by the "
        f"gateway's Registry.pick in the load generator's process. Passes per policy: {args.rounds}, the policies' "
        "order rotated each round; TTFT percentiles pooled over the passes, throughput over their total time.",
        "", *lines, "", verdict, "",
        f"Load average (1 min) at the start / end: {args.load_before:.1f} / {args.load_after:.1f}. {env['cpu']}, {env['threads']} thread(s) here, torch {env['torch']}, {env['when']}. The 2 CPU cores are "
        "shared by the workers, the load generator and other work's work on this host: absolute times move "
        "between runs; compare the policies within a run (same schedule, back to back)."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--users", type=int, default=2, help="conversations per tenant")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.15, help="conversation starts per second")
    ap.add_argument("--think", type=float, default=1.0, help="seconds between an answer and the next turn")
    ap.add_argument("--system-words", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--kv-cache-memory", default="96MiB", help="per worker: ~4.3k tokens of bf16 SmolLM2 cache")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated; add affinity for the old rule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="passes of the schedule per policy, interleaved (1: ~6 min on 2 cores; 2 for steadier tails)")
    ap.add_argument("--name", default="")
    ap.add_argument("--gateways", default="", help="e.g. 1,2,3: cache-aware through that many gateway processes")
    ap.add_argument("--unshared", action="store_true", help="with --gateways: also the most gateways, table not shared")
    args = ap.parse_args()
    args.name = args.name or ("routing_gateways" if args.gateways else "routing")
    flags = [f"--kv-cache-memory={args.kv_cache_memory}", "--threads=1", "--max-num-seqs=8",
             "--max-num-batched-tokens=256"]
    systems, convs = workload(args)
    args.load_before = os.getloadavg()[0]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TESSERA_VAR_DIR": tmp, "TESSERA_WORKER_TOKEN": "", "TESSERA_LOG_LEVEL": "WARNING"}
        os.environ.update({"DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "TESSERA_VAR_DIR": tmp,
                           "TESSERA_WORKER_TOKEN": ""})
        import django

        django.setup()
        try:
            procs, urls = start_workers(args.workers, flags, env)
            warm = [Conversation(0, 0.0, ["warm up"])]
            asyncio.run(run_phase("round_robin", "warm", urls, ["hello"], warm * args.workers, args))  # page in
            if args.gateways:
                rows, render = routing_gateways.run(args, systems, convs, urls, MODEL, tmp), routing_gateways.table
            else:
                rows, render = policies_compared(args, urls, systems, convs), table
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)
    finish(args, flags, {"worker_flags": flags, "rows": rows}, rows, render)


def policies_compared(args: argparse.Namespace, urls: list[str], systems: list[str],
                      convs: list[Conversation]) -> list[dict]:
    policies = args.policies.split(",")
    passes: dict[str, list] = {p: [] for p in policies}
    for r in range(args.rounds):  # each round in another order: the host's load drifts
        for policy in policies[r % len(policies):] + policies[:r % len(policies)]:
            results, elapsed = asyncio.run(run_phase(policy, f"{policy}-{r}", urls, systems, convs, args))
            passes[policy].append((results, elapsed))
            ttft = [x.ttft for x in results]
            print(f"round {r} {policy}: TTFT p50/p95 {percentile(ttft, 50) * 1e3:.0f}/"
                  f"{percentile(ttft, 95) * 1e3:.0f} ms, {len(results) / elapsed:.2f} req/s", flush=True)
    return [summarize(p, passes[p], urls) for p in policies]


def finish(args: argparse.Namespace, flags: list[str], data: dict, rows: list[dict], render) -> None:
    env_info = environment()
    args.load_after = os.getloadavg()[0]
    text = render(rows, args, flags, env_info)
    print(text)
    write_results(args.name, {"env": env_info, "args": vars(args), **data}, text)


if __name__ == "__main__":
    main()
