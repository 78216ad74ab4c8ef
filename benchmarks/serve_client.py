"""The serving benchmarks' client side: requests over HTTP, arrival patterns, and the worker process.

Shared by `benchmarks.serve` (the rate sweep and the HTTP-overhead comparison),
`benchmarks.serve_http_cost` and `benchmarks.load`; kept apart so that none of them imports another.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
import orjson

MODEL = "smollm2-135m-instruct"
ENGINE = {"dtype": "bfloat16", "kv_cache_memory": "512MiB", "max_num_seqs": 64, "max_num_batched_tokens": 512}


@dataclass
class Req:
    prompt: str
    max_tokens: int


@dataclass
class Result:
    start: float
    end: float = 0.0
    times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    tokens: int = 0
    error: str | None = None


# -- one request, two paths ------------------------------------------------------------------------
def request_body(req: Req) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": req.prompt, "max_tokens": req.max_tokens, "ignore_eos": True,
                         "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})


def record(res: Result, payload: bytes, now: float) -> None:
    """One SSE `data:` payload: a token chunk, the usage chunk, an in-band error or [DONE]."""
    if payload.startswith(b'{"error"'):
        res.error = "in-band error"
    elif b'"choices":[]' in payload:
        res.tokens = orjson.loads(payload)["usage"]["completion_tokens"]
    elif payload != b"[DONE]" and b'"text":""' not in payload:
        res.times.append(now)


async def via_raw(url: str, headers: dict[str, str], req: Req) -> Result:
    """A minimal HTTP/1.1 client: one connection per request, chunked SSE read by hand. httpx spends
    ~90 us of CPU per streamed token, this ~35 us; on a 2-core machine whatever the load generator
    uses is taken from the engine, so this is the default."""
    res = Result(time.perf_counter())
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    body = request_body(req)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n%b\r\n" % (host.encode(), len(body), extra) + body)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            res.error = f"HTTP {status}"
        else:
            buf = b""
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):  # chunked framing; 0 ends
                buf += (await reader.readexactly(size + 2))[:-2]
                now = time.perf_counter()
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    if event.startswith(b"data: "):
                        record(res, event[6:], now)
        writer.close()
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        res.error = type(exc).__name__
    res.end = time.perf_counter()
    return res


async def via_httpx(client: httpx.AsyncClient, url: str, req: Req) -> Result:
    res = Result(time.perf_counter())
    try:
        async with client.stream("POST", url + "/v1/completions", content=request_body(req),
                                 headers={"Content-Type": "application/json"}) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}"
                await r.aread()
            else:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        record(res, line[6:].encode(), time.perf_counter())
    except httpx.HTTPError as exc:
        res.error = type(exc).__name__
    res.end = time.perf_counter()
    return res


# -- arrival patterns --------------------------------------------------------------------------------
async def poisson(one, reqs: list[Req], rate: float, seed: int) -> list[Result]:
    rng = random.Random(seed)
    tasks, t = [], time.perf_counter()
    for req in reqs:
        t += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        tasks.append(asyncio.create_task(one(req)))
    return await asyncio.gather(*tasks)


async def closed_loop(one, reqs: list[Req], concurrency: int) -> list[Result]:
    slots = asyncio.Semaphore(concurrency)

    async def run(req: Req) -> Result:
        async with slots:
            return await one(req)

    return await asyncio.gather(*(run(r) for r in reqs))


def process_cpu(pid: int | None) -> float:
    """CPU seconds used so far by a process (user + system), this one when pid is None."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the worker process ------------------------------------------------------------------------------
def start_worker(command: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start a worker (by default `python -m dataplane.worker` with ENGINE's settings) on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if command is None:
        command = [sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--log-level", "warning",
                   *(f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items())]
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_WORKER_TOKEN"}
    proc = subprocess.Popen([*command, "--port", str(port)], env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the worker exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"the worker at {url} was not ready after {timeout:.0f} s")
