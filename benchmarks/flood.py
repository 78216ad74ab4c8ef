"""A free-tier flood against `make run`'s real stack, and what it does to a premium tenant's TTFT.

    python -m benchmarks.flood [--seconds 40] [--premium 20] [--waits active,passive]

For each OpenMP wait policy asked for, the whole local stack (`python -m controlplane.localstack`: uvicorn
gateway, Celery, the real SmolLM2-135M CPU worker, SQLite, the file-system broker) is started in a fresh
state folder with OMP_WAIT_POLICY set for its processes, a premium and a free tenant are made with
`manage.py tenant_create`, and then:
- quiet: the premium tenant's streamed chat completions (`max_tokens` 48), one at a time, timed to the
  first content event;
- flooded: the same while the free tenant floods the gateway from its own process at `nice 10` (48
  streamed chat completions in flight, each answered request sent again at once), as in the issue.
Reported: premium TTFT p50/p95 quiet and flooded and their ratio (target ≤ 1.5×), the flood's answers by
status (every refusal a 429 with Retry-After; no 5xx), and the gateway's CPU per flood answer.

The CPU is recorded; compare only within one run. benchmarks.cpu_contention isolates the engine's part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks.common import cpu_seconds, percentile
from benchmarks.gateway_refusals import ttfts

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"


async def _flood(url: str, key: str, concurrency: int, seconds: float) -> dict:
    """The flooder's body (run in its own process): `concurrency` streamed requests in flight."""
    statuses: Counter = Counter()
    missing_retry_after = 0
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a joke."}], "max_tokens": 16,
            "stream": True}
    end = time.monotonic() + seconds

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal missing_retry_after
        while time.monotonic() < end:
            try:
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                         headers={"Authorization": f"Bearer {key}"}) as r:
                    async for _ in r.aiter_bytes():
                        pass
                    statuses[r.status_code] += 1
                    if r.status_code == 429 and "retry-after" not in r.headers:
                        missing_retry_after += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(one(client) for _ in range(concurrency)))
    return {"statuses": dict(statuses), "seconds": seconds, "missing_retry_after": missing_retry_after}


def _stack(var: Path, port: int, wait: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TESSERA_VAR_DIR": str(var), "OMP_WAIT_POLICY": wait.upper()}
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.localstack", "--port", str(port),
                             "--worker-port", str(port + 100)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 900
    for line in proc.stdout:
        if line.startswith("TESSERA_URL="):
            return proc, line.split("=", 1)[1].strip().removesuffix("/v1")
        if time.monotonic() > deadline:
            break
    raise RuntimeError("the local stack did not come up")


def _tenant(var: Path, name: str, tier: str) -> str:
    env = {**os.environ, "TESSERA_VAR_DIR": str(var)}
    out = subprocess.run([sys.executable, "manage.py", "tenant_create", "--name", name, "--tier", tier],
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])["api_key"]


def _web_pid(var: Path) -> int:
    out = subprocess.run(["pgrep", "-f", "uvicorn controlplane.asgi"], capture_output=True, text=True).stdout.split()
    return int(out[0])


def run_one(wait: str, port: int, seconds: float, premium_n: int, concurrency: int) -> dict:
    var = Path(tempfile.mkdtemp(prefix="tessera-flood-"))
    proc, url = _stack(var, port, wait)
    try:
        premium, free = _tenant(var, "Premium Co", "premium"), _tenant(var, "Free Co", "free")
        quiet = ttfts(url, premium, MODEL, premium_n, 48)  # after 3 unmeasured
        web = _web_pid(var)
        flooder = subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "benchmarks.flood", "--flooder", url,
                                    "--key", free, "--seconds", str(seconds), "--concurrency", str(concurrency)],
                                   cwd=ROOT, stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)
        cpu0, t0 = cpu_seconds(web), time.perf_counter()
        flooded = ttfts(url, premium, MODEL, premium_n, 48, warmup=0)
        cpu, elapsed = cpu_seconds(web) - cpu0, time.perf_counter() - t0
        report = json.loads(flooder.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(var, ignore_errors=True)
    answered = sum(v for k, v in report["statuses"].items() if k.isdigit())
    rate = answered / report["seconds"]
    q95, f95 = percentile(quiet, 95), percentile(flooded, 95)
    return {"wait": wait, "quiet_p50": percentile(quiet, 50), "quiet_p95": q95,
            "flooded_p50": percentile(flooded, 50), "flooded_p95": f95, "p95_ratio": f95 / q95,
            "flood": report, "flood_answers_per_s": rate,
            "gateway_cpu_ms_per_flood_answer": cpu * 1e3 / max(rate * elapsed, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="the flood's length (premium requests end first)")
    ap.add_argument("--premium", type=int, default=20, help="premium requests timed, quiet and flooded")
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--waits", default="active,passive")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--flooder", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--key", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flooder:
        print(json.dumps(asyncio.run(_flood(args.flooder, args.key, args.concurrency, args.seconds))), flush=True)
        return

    from benchmarks.common import _cpu_name, write_results

    rows = [run_one(w, args.port, args.seconds, args.premium, args.concurrency) for w in args.waits.split(",")]
    cpu, when = _cpu_name(), time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# Free-tier flood vs premium TTFT through `make run` ({cpu}, {os.cpu_count()} cores, {when})", "",
             f"`python -m benchmarks.flood --seconds {args.seconds:g} --premium {args.premium} --concurrency "
             f"{args.concurrency} --waits {args.waits}`: the real stack (SQLite, file-system broker, one SmolLM2 "
             "CPU worker); premium streamed chat, max_tokens 48, one at a time; the flood from its own process "
             f"at nice 10, {args.concurrency} streamed requests in flight.", "",
             "| OMP_WAIT_POLICY | premium TTFT p50 / p95 quiet (ms) | flooded (ms) | **p95 ×** | flood answers/s | "
             "flood statuses | gateway CPU ms per flood answer |", "|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['wait']} | {r['quiet_p50']:.0f} / {r['quiet_p95']:.0f} | {r['flooded_p50']:.0f} / "
                     f"{r['flooded_p95']:.0f} | **{r['p95_ratio']:.2f}×** | {r['flood_answers_per_s']:.0f} | "
                     f"{r['flood']['statuses']} (429s without Retry-After: {r['flood']['missing_retry_after']}) | "
                     f"{r['gateway_cpu_ms_per_flood_answer']:.2f} |")
    write_results("flood", {"cpu": cpu, "cores": os.cpu_count(), "when": when, "rows": rows}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
