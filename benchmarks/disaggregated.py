"""Prefill and decode on separate workers against one unified worker, on this machine (real SmolLM2 workers).

    python -m benchmarks.disaggregated [--long 2048] [--prompts 4] [--streams 4] [--stream-tokens 96]
                                       [--arrival-gap 2.0] [--duration 24]

1. Transfer: the benchmark asks a prefill worker for a prompt's blocks twice (`POST /tessera/v1/kv/prefill`,
   read and verified as a decode worker does); the second answer comes from its cache: until its headers,
   the prefill worker's step for the prompt's last tokens and the export; its body is the protocol's
   (framing, checksums, HTTP over loopback TCP), per request and per block.
2. TTFT of a long prompt (`--long` tokens, fresh each time): a unified worker (1 thread) against a decode
   worker (1 thread) whose prefill worker (1 thread) computes it: the same compute, plus the transfer, the
   import into the decode worker's second tier and the load from it.
3. Streams while long prompts arrive: `--streams` clients stream `--stream-tokens`-token answers to short
   prompts back to back while a long prompt arrives every `--arrival-gap` s, for `--duration` s. ITL p50 / p95
   / max of the streams and the long prompts' TTFT: a unified worker with 2 threads against the decode worker
   and its prefill worker with 1 thread each (the same two cores).

What two cores can and cannot show: the protocol's cost and correctness (1, 2) are measured as they are; the
ITL comparison (3) is two processes time-sharing two cores with the client, where a GPU deployment gives
each role its own device: the separation that keeps decode steps free of prefill chunks is real here, the
cores are not.
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

import httpx
import orjson

from benchmarks.common import (
    environment,
    fmt,
    percentile,
    read_chat_stream,
    stop_processes,
    ttft_and_gaps,
    write_results,
)
from benchmarks.gateway import free_port
from dataplane.kv_cache.transfer import Decoder

MODEL = "smollm2-135m-instruct"
TOKEN = "bench-worker-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WORDS = ("river stone lantern orbit harvest copper meadow signal thunder quiet garden engine anchor velvet "
         "compass ember glacier harbor mosaic needle").split()


class Worker:
    def __init__(self, name: str, threads: int, *flags: str) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"disagg-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port", self.url.rsplit(":", 1)[1],
             "--dtype", "bfloat16", "--kv-cache-memory", "512MiB", "--threads", str(threads), "--no-load-curve",
             *flags], env={**os.environ, "TESSERA_WORKER_TOKEN": TOKEN}, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log.name}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not ready; see {self.log.name}")

    def metric(self, name: str) -> float:
        total = 0.0
        for line in httpx.get(self.url + "/metrics", headers=HEADERS, timeout=10).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


def long_text(rng: random.Random, tokens: int) -> str:
    # ~1.3 tokens a word for these words with their spaces: a little over `tokens` once templated
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.3)))


async def stream_chat(client: httpx.AsyncClient, url: str, content: str, max_tokens: int
                      ) -> tuple[float | None, list[float]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    start = time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
        r.raise_for_status()
        await read_chat_stream(r, arrivals)
    return ttft_and_gaps(start, arrivals)


async def transfer(prefill: Worker, decode: Worker, rng: random.Random, a: argparse.Namespace) -> dict:
    """The protocol: a prompt the prefill worker computes, then asks for again (its blocks cached there). The
    second answer's headers come after the prefill worker's step for the prompt's last tokens and the export;
    its body is the transfer and the verification, timed apart."""
    fingerprint, block_bytes = await _layout(decode)
    rows = []
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(a.prompts):
            ids = [rng.randrange(1000, 40000) for _ in range(a.long)]
            body = {"token_ids": ids, "cache_salt": None, "skip_blocks": 0, "layout": fingerprint.hex()}
            times = []
            for _ in range(2):  # the first computes the prompt; the second finds it cached
                t0 = time.perf_counter()
                decoder = Decoder(fingerprint, block_bytes)
                async with client.stream("POST", prefill.url + "/tessera/v1/kv/prefill", content=orjson.dumps(body),
                                         headers=HEADERS) as r:
                    r.raise_for_status()
                    t1 = time.perf_counter()
                    async for chunk in r.aiter_raw():
                        decoder.feed(chunk)
                blocks = decoder.finish()
                times.append((t1 - t0, time.perf_counter() - t1))
            rows.append({"blocks": len(blocks), "first_s": sum(times[0]), "cached_headers_s": times[1][0],
                         "cached_body_s": times[1][1]})
    n = sum(r["blocks"] for r in rows)
    body_s = sum(r["cached_body_s"] for r in rows)
    return {"requests": rows, "block_bytes": block_bytes, "blocks_per_request": n / len(rows),
            "headers_ms": sum(r["cached_headers_s"] for r in rows) / len(rows) * 1000,
            "per_request_ms": body_s / len(rows) * 1000, "per_block_ms": body_s / n * 1000,
            "mb_per_s": n * block_bytes / body_s / 1e6}


async def _layout(decode: Worker) -> tuple[bytes, int]:
    """The decode worker's KV layout (the prefill route refuses another)."""
    async with httpx.AsyncClient() as client:
        body = (await client.get(decode.url + "/tessera/v1/kv/layout", headers=HEADERS)).json()
    return bytes.fromhex(body["layout"]), body["block_bytes"]


async def ttft(worker: Worker, rng: random.Random, a: argparse.Namespace) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=300) as client:
        for _ in range(a.prompts):
            first, _ = await stream_chat(client, worker.url, long_text(rng, a.long), 4)
            out.append(first)
    return out


async def under_arrivals(worker: Worker, rng: random.Random, a: argparse.Namespace) -> dict:
    gaps: list[float] = []
    long_ttft: list[float] = []
    stop = time.perf_counter() + a.duration
    async with httpx.AsyncClient(timeout=300) as client:
        async def streamer(i: int) -> None:
            while time.perf_counter() < stop:
                _, g = await stream_chat(client, worker.url, f"Stream {i}: tell a long story about {rng.choice(WORDS)}.",
                                         a.stream_tokens)
                gaps.extend(g[1:])  # the first gap can hold the stream's own prefill tail

        async def arrivals() -> None:
            tasks = []
            while time.perf_counter() < stop - a.arrival_gap:
                await asyncio.sleep(a.arrival_gap)
                tasks.append(asyncio.create_task(stream_chat(client, worker.url, long_text(rng, a.long), 4)))
            for t in tasks:
                first, _ = await t
                long_ttft.append(first)

        await asyncio.gather(arrivals(), *(streamer(i) for i in range(a.streams)))
    return {"itl_p50_ms": percentile(gaps, 50), "itl_p95_ms": percentile(gaps, 95), "itl_max_ms": max(gaps),
            "gaps": len(gaps), "long_ttft_p50_ms": percentile(long_ttft, 50), "long_prompts": len(long_ttft)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.disaggregated", description=__doc__.splitlines()[0])
    p.add_argument("--long", type=int, default=2048, help="tokens of a long prompt")
    p.add_argument("--prompts", type=int, default=4, help="long prompts timed in parts 1 and 2")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--stream-tokens", type=int, default=96)
    p.add_argument("--arrival-gap", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=24.0)
    p.add_argument("--name", default="disaggregated")
    a = p.parse_args()
    rng = random.Random(0)
    prefill = Worker("prefill", 1)
    decode = Worker("decode", 1, "--kv-offload-size", "2GiB", "--prefill-url", prefill.url,
                    "--prefill-min-tokens", "256")
    unified1 = Worker("unified-1t", 1)
    workers = [prefill, decode, unified1]
    try:
        for w in workers:
            w.wait_ready()
        results: dict = {"transfer": asyncio.run(transfer(prefill, decode, rng, a))}
        print("transfer", results["transfer"], flush=True)
        results["ttft_unified_ms"] = asyncio.run(ttft(unified1, rng, a))
        results["ttft_disaggregated_ms"] = asyncio.run(ttft(decode, rng, a))
        print("ttft", results["ttft_unified_ms"], results["ttft_disaggregated_ms"], flush=True)
        stop_processes([unified1.proc], 30)
        unified2 = Worker("unified-2t", 2)
        workers.append(unified2)
        unified2.wait_ready()
        stop_processes([prefill.proc, decode.proc], 30)  # idle, but out of the way
        results["arrivals_unified"] = asyncio.run(under_arrivals(unified2, rng, a))
        print("unified", results["arrivals_unified"], flush=True)
        stop_processes([unified2.proc], 30)
        prefill = Worker("prefill", 1)
        decode = Worker("decode", 1, "--kv-offload-size", "2GiB", "--prefill-url", prefill.url,
                        "--prefill-min-tokens", "256")
        workers += [prefill, decode]
        prefill.wait_ready()
        decode.wait_ready()
        results["arrivals_disaggregated"] = asyncio.run(under_arrivals(decode, rng, a))
        results["decode_outcomes"] = {"ok": decode.metric("tessera:disagg_prefill_requests_total")}
        print("disaggregated", results["arrivals_disaggregated"], flush=True)
    finally:
        stop_processes([w.proc for w in workers], 30)
    write(results, a)


def write(results: dict, a: argparse.Namespace) -> None:
    env = environment()
    t = results["transfer"]
    tu, td = results["ttft_unified_ms"], results["ttft_disaggregated_ms"]
    u, d = results["arrivals_unified"], results["arrivals_disaggregated"]
    lines = ["# Prefill and decode on separate workers (`python -m benchmarks.disaggregated`)", "",
             f"{MODEL} (bf16 weights and cache), real worker processes, {env['cpu']} ({env['cpu_capability']}), "
             f"torch {env['torch']}, {env['when']}. Long prompts: {a.long} tokens.", "",
             "| transfer (a cached prompt, loopback TCP, verified) | |", "|---|---|",
             f"| blocks per {a.long}-token prompt | {t['blocks_per_request']:.0f} ({t['block_bytes'] / 1024:.0f} KiB each) |",
             f"| the prefill worker's answer begins (its step for the last tokens, the export), ms | "
             f"{fmt(t['headers_ms'], 0)} |",
             f"| the blocks' transfer and verification, per request, ms | {fmt(t['per_request_ms'], 1)} |",
             f"| per block, ms | {fmt(t['per_block_ms'], 3)} |",
             f"| throughput, MB/s | {fmt(t['mb_per_s'], 0)} |", "",
             "| long-prompt TTFT, ms (1 thread computes the prompt either way) | p50 | each |", "|---|---|---|",
             f"| unified worker | {fmt(percentile(tu, 50), 0)} | {', '.join(fmt(x, 0) for x in tu)} |",
             f"| decode worker + prefill worker | {fmt(percentile(td, 50), 0)} | {', '.join(fmt(x, 0) for x in td)} |",
             f"| overhead | {fmt(percentile(td, 50) - percentile(tu, 50), 0)} ms "
             f"({fmt(percentile(td, 50) / percentile(tu, 50), 2)}x) | |", "",
             f"| {a.streams} streams while a {a.long}-token prompt arrives every {a.arrival_gap:g} s ({a.duration:g} s) "
             "| ITL p50 / p95 / max, ms | long prompts' TTFT p50, ms |", "|---|---|---|",
             f"| unified worker, 2 threads | {fmt(u['itl_p50_ms'], 0)} / {fmt(u['itl_p95_ms'], 0)} / "
             f"{fmt(u['itl_max_ms'], 0)} | {fmt(u['long_ttft_p50_ms'], 0)} ({u['long_prompts']} prompts) |",
             f"| decode worker + prefill worker, 1 thread each | {fmt(d['itl_p50_ms'], 0)} / {fmt(d['itl_p95_ms'], 0)} / "
             f"{fmt(d['itl_max_ms'], 0)} | {fmt(d['long_ttft_p50_ms'], 0)} ({d['long_prompts']} prompts) |", "",
             "Two cores: the streams' decode steps on the decode worker carry no prefill chunk (the prefill worker "
             "computes the long prompts), but both processes and the client share the same two cores, so the "
             "separation's gain is partly eaten by time-sharing; on GPUs each role has its own device."]
    table = "\n".join(lines)
    write_results(a.name, {"environment": env, "args": vars(a), "results": results}, table)
    print(table)


if __name__ == "__main__":
    main()
