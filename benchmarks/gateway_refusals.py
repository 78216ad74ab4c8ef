"""What refused requests cost the gateway, and what a flood of them does to a paying tenant.

Part of `python -m benchmarks.gateway` (which starts the processes and writes the table). A free-tier
tenant far over its requests-per-minute limit floods chat completions with its valid key from 48
connections (the flooder of tests/controlplane/test_auth_throttle_flood.py, from 127.0.0.2), and:
- the gateway's CPU time over the flood ÷ the 429s it answered is the CPU per refusal;
- a premium tenant's streamed requests, one at a time, are timed to the first content event (TTFT)
  without the flood and then during it.
The upstream is the fake worker slowed to a fixed per-token delay (its TTFT is one token's delay), so
what moves the premium TTFT is the gateway and the shared CPUs, not a model's batching. The same
flood against `refuse_all` (uvicorn answering a fixed 429, nothing else) is the floor of what a refusal
costs in Python here, and what the flood's load alone does to the premium tenant on shared CPUs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

from benchmarks.common import cpu_seconds, percentile
from controlplane.gateway import server_timing

ROOT = Path(__file__).resolve().parent.parent
FLOOD_ADDRESS = "127.0.0.2"  # the flood's own address: its traffic is told apart from the premium client's


_REFUSAL = orjson.dumps({"error": {"message": "Rate limit reached.", "type": "requests", "param": None,
                                  "code": "rate_limit_exceeded"}})


async def refuse_all(scope, receive, send):
    """The floor: a 429 for every request, body unread. Served as `uvicorn benchmarks.gateway_refusals:refuse_all`."""
    if scope["type"] != "http":
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        return
    status = 200 if scope["path"] == "/health" else 429
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"30")]})
    await send({"type": "http.response.body", "body": b"{}" if status == 200 else _REFUSAL})


def ttfts(url: str, key: str, model: str, n: int, max_tokens: int, warmup: int = 3,
          stages: list[dict[str, float]] | None = None, itls: list[float] | None = None) -> list[float]:
    """Milliseconds to the first content event of `n` streamed chat completions, one at a time; with
    `stages`, each measured request's Server-Timing stages are appended there too, and with `itls` its
    mean milliseconds between content events after the first."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": max_tokens,
            "stream": True}
    samples = []
    with httpx.Client(timeout=30) as client:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            first, last, events = None, None, 0
            with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {key}"}) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"premium stream: {r.status_code} {r.read()[:200]!r}")
                for line in r.iter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        last, events = (time.perf_counter() - t0) * 1000, events + 1
                        first = last if first is None else first
            if first is None:
                raise RuntimeError("premium stream carried no content")
            if i >= warmup:
                samples.append(first)
                if stages is not None:
                    stages.append(server_timing.parse(r.headers.get("server-timing")))
                if itls is not None and events > 1:
                    itls.append((last - first) / (events - 1))
    return samples


class Flood:
    """The over-limit tenant's flood, running until stopped; `report` is the flooder's count by status."""

    def __init__(self, url: str, key: str, concurrency: int, seconds: float = 600.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.controlplane.test_auth_throttle_flood", "--flood", url, "--key", key,
             "--seconds", str(seconds), "--concurrency", str(concurrency), "--address", FLOOD_ADDRESS],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.report: dict = {}

    def __enter__(self) -> Flood:
        if self.proc.stdout.readline().strip() != "flooding":
            raise RuntimeError("the flooder did not start")
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            self.report = json.loads(self.proc.communicate(timeout=60)[0])
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def refusal_cpu(url: str, pid: int, key: str, concurrency: int, seconds: float) -> dict:
    """The gateway's CPU per answer while the over-limit key floods it, and its refusals per second."""
    with Flood(url, key, concurrency) as flood:
        time.sleep(0.5)  # connections open, the key cached
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        time.sleep(seconds)
        cpu, elapsed = cpu_seconds(pid) - cpu0, time.perf_counter() - t0
    statuses = flood.report["statuses"]
    answered = sum(statuses.values())
    # The flooder counts from its start (0.5 s earlier) to its stop: scale its rate to the window.
    rate = answered / flood.report["seconds"]
    return {"cpu_ms_per_answer": cpu * 1000 / (rate * elapsed), "answers_per_s": rate, "statuses": statuses,
            "concurrency": concurrency, "seconds": elapsed, "gateway_cpu_share": cpu / elapsed}


def premium_under_flood(url: str, premium_key: str, free_key: str, model: str, n: int, max_tokens: int,
                        concurrency: int, floor_url: str) -> dict:
    """The premium tenant's TTFT p50/p95 alone, during the free tier's flood of the gateway, and during
    the same flood aimed at the floor's process instead (the flood's load on the CPUs, no gateway work)."""
    samples = {"quiet": ttfts(url, premium_key, model, n, max_tokens)}
    out = {"n": n, "max_tokens": max_tokens, "concurrency": concurrency}
    for name, target in (("flooded", url), ("flood_elsewhere", floor_url)):
        with Flood(target, free_key, concurrency) as flood:
            time.sleep(0.5)
            samples[name] = ttfts(url, premium_key, model, n, max_tokens)
        out[f"{name}_report"] = {**flood.report, "per_s": sum(flood.report["statuses"].values()) / flood.report["seconds"]}
    for name, values in samples.items():
        out[name] = {"ttft_p50_ms": percentile(values, 50), "ttft_p95_ms": percentile(values, 95)}
    out["p95_ratio"] = out["flooded"]["ttft_p95_ms"] / out["quiet"]["ttft_p95_ms"]
    out["p95_ratio_flood_elsewhere"] = out["flood_elsewhere"]["ttft_p95_ms"] / out["quiet"]["ttft_p95_ms"]
    return out


def table_lines(lat: dict, cpu: dict, flood_cpu: dict, floor_cpu: dict, flood: dict, token_delay: float,
                idle_ms: float) -> list[str]:
    """The markdown section for gateway.md: `lat` and `cpu` are the latency run's, by path; `idle_ms` what an
    idle gateway burns in the time of one sequential request."""
    s = flood_cpu["statuses"]
    q, f, e = flood["quiet"], flood["flooded"], flood["flood_elsewhere"]
    fr, er = flood["flooded_report"], flood["flood_elsewhere_report"]
    return [
        "## Refused requests",
        "",
        "A free-tier tenant far over its requests-per-minute limit (2 RPM) sends chat completions with its valid "
        "key; every answer past its first two is a 429 `rate_limit_exceeded` with the usual Retry-After and "
        "x-ratelimit-* headers. Gateway CPU per request from /proc (user + system) of the gateway process.",
        "",
        "| request | gateway CPU/request (ms) | p50 (ms) | p99 (ms) |",
        "|---|---|---|---|",
        f"| admitted (inline gateway, latency run above) | {cpu['inline']:.2f} | "
        f"{lat['inline']['p50_ms']:.2f} | {lat['inline']['p99_ms']:.2f} |",
        f"| refused 429, sequential (interleaved with the latency run) | {cpu['refused']:.2f} | "
        f"{lat['refused']['p50_ms']:.2f} | {lat['refused']['p99_ms']:.2f} |",
        f"| refused 429, {flood_cpu['concurrency']} clients flooding | {flood_cpu['cpu_ms_per_answer']:.2f} | | |",
        f"| bare uvicorn answering a fixed 429 (floor), {floor_cpu['concurrency']} clients flooding | "
        f"{floor_cpu['cpu_ms_per_answer']:.2f} | | |",
        f"| bare uvicorn+httpx proxy, admitted (floor) | {cpu['bare']:.2f} | | |",
        "",
        f"The sequential rows include what a gateway burns idle (worker polling) while the other paths take "
        f"their turn: {idle_ms:.2f} ms per request here. "
        f"Target: a refusal ≤ 0.5 ms of CPU. The flood got {flood_cpu['answers_per_s']:.0f} answers/s "
        f"({s}) with the gateway process at {flood_cpu['gateway_cpu_share'] * 100:.0f}% of a CPU.",
        "",
        f"Premium tenant (priority 0, no limits) streaming `max_tokens={flood['max_tokens']}` one request at a time "
        f"through the same gateway; upstream: the fake worker at {token_delay * 1000:.0f} ms per token (its TTFT is "
        f"one token), {flood['n']} requests per phase:",
        "",
        "| premium TTFT | p50 (ms) | p95 (ms) |",
        "|---|---|---|",
        f"| alone | {q['ttft_p50_ms']:.1f} | {q['ttft_p95_ms']:.1f} |",
        f"| during the free tier's flood of the gateway ({flood['concurrency']} clients, {fr['per_s']:.0f} answers/s: "
        f"{fr['statuses']}) | {f['ttft_p50_ms']:.1f} | {f['ttft_p95_ms']:.1f} |",
        f"| during the same flood aimed at the bare 429 server instead ({er['per_s']:.0f} answers/s) | "
        f"{e['ttft_p50_ms']:.1f} | {e['ttft_p95_ms']:.1f} |",
        "",
        f"p95 during the flood / alone: **{flood['p95_ratio']:.2f}×** (target < 1.5×); with the flood aimed "
        f"elsewhere on the same CPUs: {flood['p95_ratio_flood_elsewhere']:.2f}×.",
    ]
