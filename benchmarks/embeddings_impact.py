"""What an embeddings flood costs the premium tier's streams on the same worker, and what it gets.

    python -m benchmarks.embeddings_impact [--seconds 20] [--rate 1.0] [--clients 4] [--inputs 8]

One SmolLM2-135M worker with the load benchmark's flags (8 seats, the ITL guard for priority 10),
called directly (no gateway). Premium: streamed chat requests at priority 10 as Poisson arrivals at
`--rate`, `--max-tokens` tokens each (`ignore_eos`). Embeddings: `--clients` loops, each sending
`/v1/embeddings` requests of `--inputs` texts (~120 tokens each) back to back at priority 20.

1. Premium alone: client-side TTFT p95 and ITL p95 (token gaps).
2. Premium while the embeddings flood runs. Target: ITL p95 within 1.2x of (1).
3. The flood alone: embedded inputs/s and tokens/s, against what it got in (2).

Embedding inputs are prompt-only engine requests (runner/pooling.py): the scheduler's priorities and
ITL guard treat them as any lower-priority prefill. The load generator and the worker share the CPU.
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
from benchmarks.load import MODEL, WORKER_FLAGS
from benchmarks.serve_client import wait_ready

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("Tessera serves language models to many tenants at once; each request is scheduled by priority, "
        "batched with others and metered exactly. ")


async def chat(client: httpx.AsyncClient, url: str, max_tokens: int, out: list) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Write a short note about number {random.random():.6f}."}]}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Priority": "10"}) as r:
        if r.status_code != 200:
            out.append({"status": r.status_code})
            return
        await read_chat_stream(r, arrivals)
    ttft, gaps = ttft_and_gaps(t0, arrivals)
    out.append({"status": 200, "ttft_ms": ttft, "gaps": gaps})


async def premium(url: str, rate: float, seconds: float, max_tokens: int) -> dict:
    rows: list = []
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
        tasks = []
        end = time.perf_counter() + seconds
        while True:
            await asyncio.sleep(random.expovariate(rate))
            if time.perf_counter() >= end:
                break
            tasks.append(asyncio.create_task(chat(client, url, max_tokens, rows)))
        await asyncio.gather(*tasks)
    ok = [r for r in rows if r["status"] == 200 and r["ttft_ms"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    ttfts = [r["ttft_ms"] for r in ok]
    return {"sent": len(rows), "completed": len(ok), "ttft_p50_ms": percentile(ttfts, 50),
            "ttft_p95_ms": percentile(ttfts, 95), "itl_p50_ms": percentile(gaps, 50), "itl_p95_ms": percentile(gaps, 95)}


async def flood(url: str, clients: int, inputs: int, stop: asyncio.Event) -> dict:
    done = {"requests": 0, "inputs": 0, "tokens": 0, "errors": 0, "latency_ms": []}

    async def loop(c: int) -> None:
        async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
            i = 0
            while not stop.is_set():
                body = {"model": MODEL, "input": [f"{c}.{i}.{j} {TEXT * 3}" for j in range(inputs)]}
                t0 = time.perf_counter()
                r = await client.post(url + "/v1/embeddings", json=body, headers={"X-Priority": "20"})
                i += 1
                if r.status_code != 200:
                    done["errors"] += 1
                    await asyncio.sleep(0.1)
                    continue
                done["latency_ms"].append((time.perf_counter() - t0) * 1000)
                done["requests"] += 1
                done["inputs"] += inputs
                done["tokens"] += r.json()["usage"]["prompt_tokens"]

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in range(clients)))
    elapsed = time.perf_counter() - t0
    lat = done.pop("latency_ms")
    return {**done, "seconds": elapsed, "inputs_per_s": done["inputs"] / elapsed,
            "tokens_per_s": done["tokens"] / elapsed, "request_p50_ms": percentile(lat, 50),
            "request_p95_ms": percentile(lat, 95)}


async def with_flood(url: str, args: argparse.Namespace, run_premium: bool) -> tuple[dict | None, dict]:
    stop = asyncio.Event()
    flooding = asyncio.create_task(flood(url, args.clients, args.inputs, stop))
    await asyncio.sleep(2.0)  # the flood fills the queue first
    if run_premium:
        stats = await premium(url, args.rate, args.seconds, args.max_tokens)
    else:
        await asyncio.sleep(args.seconds)
        stats = None
    stop.set()
    return stats, await flooding


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="premium arrivals per phase")
    p.add_argument("--rate", type=float, default=1.0, help="premium requests per second")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--clients", type=int, default=4, help="concurrent embeddings loops")
    p.add_argument("--inputs", type=int, default=8, help="texts per embeddings request")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    random.seed(0)
    flags = [f"--dtype={args.dtype}", *WORKER_FLAGS, "--max-waiting=128", "--waiting-limits="]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TESSERA_WORKER_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port", str(port),
                             "--log-level", "warning", *flags], env=env, cwd=ROOT)
    try:
        wait_ready(url, proc)
        asyncio.run(premium(url, 1.0, 3, args.max_tokens))  # warm-up
        alone = asyncio.run(premium(url, args.rate, args.seconds, args.max_tokens))
        print(f"premium alone: ITL p95 {fmt(alone['itl_p95_ms'])} ms, TTFT p95 {fmt(alone['ttft_p95_ms'], 0)} ms",
              flush=True)
        shared, flood_shared = asyncio.run(with_flood(url, args, True))
        print(f"premium + embeddings: ITL p95 {fmt(shared['itl_p95_ms'])} ms, TTFT p95 "
              f"{fmt(shared['ttft_p95_ms'], 0)} ms; embeddings {flood_shared['inputs_per_s']:.1f} inputs/s", flush=True)
        _, flood_alone = asyncio.run(with_flood(url, args, False))
        print(f"embeddings alone: {flood_alone['inputs_per_s']:.1f} inputs/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    data = {"environment": environment(), "args": vars(args), "worker_flags": flags, "premium_alone": alone,
            "premium_with_embeddings": shared, "embeddings_with_premium": flood_shared,
            "embeddings_alone": flood_alone,
            "itl_p95_ratio": shared["itl_p95_ms"] / alone["itl_p95_ms"] if alone["itl_p95_ms"] else None}
    jpath, mpath = write_results("embeddings_impact", data, table(data))
    print(table(data))
    print(f"wrote {jpath} and {mpath}")


def table(d: dict) -> str:
    a, s, fs, fa, env = (d["premium_alone"], d["premium_with_embeddings"], d["embeddings_with_premium"],
                         d["embeddings_alone"], d["environment"])
    return "\n".join([
        "# Embeddings beside generation (`python -m benchmarks.embeddings_impact`)", "",
        f"One SmolLM2-135M worker ({' '.join(d['worker_flags'])}); premium streams at priority 10, "
        f"{d['args']['rate']} req/s x {d['args']['max_tokens']} tokens; embeddings at priority 20, "
        f"{d['args']['clients']} clients x {d['args']['inputs']} inputs of ~120 tokens, back to back. "
        f"{env['cpu']}, {env['when'][:10]}.", "",
        "| | premium TTFT p50 / p95 ms | premium ITL p50 / p95 ms | embeddings inputs/s | tokens/s | request p50 / p95 ms |",
        "|---|---|---|---|---|---|",
        f"| premium alone | {fmt(a['ttft_p50_ms'], 0)} / {fmt(a['ttft_p95_ms'], 0)} | "
        f"{fmt(a['itl_p50_ms'])} / {fmt(a['itl_p95_ms'])} | – | – | – |",
        f"| premium + embeddings | {fmt(s['ttft_p50_ms'], 0)} / {fmt(s['ttft_p95_ms'], 0)} | "
        f"{fmt(s['itl_p50_ms'])} / {fmt(s['itl_p95_ms'])} | {fs['inputs_per_s']:.1f} | {fs['tokens_per_s']:.0f} | "
        f"{fmt(fs['request_p50_ms'], 0)} / {fmt(fs['request_p95_ms'], 0)} |",
        f"| embeddings alone | – | – | {fa['inputs_per_s']:.1f} | {fa['tokens_per_s']:.0f} | "
        f"{fmt(fa['request_p50_ms'], 0)} / {fmt(fa['request_p95_ms'], 0)} |",
        "", f"Premium ITL p95 with the flood: {fmt(d['itl_p95_ratio'], 2)}x alone (target <= 1.2x).",
    ])


if __name__ == "__main__":
    main()
