"""Gateway overhead: added latency over a direct worker call at max_tokens=1, and the
authenticated request rate one gateway process sustains.

    python -m benchmarks.gateway                      # against the fast fake upstream (no model)
    python -m benchmarks.gateway --worker-url http://127.0.0.1:8100 --model smollm2-135m-instruct

Starts, as separate processes: the upstream (unless --worker-url), two gateway configurations (one
uvicorn process each, fresh SQLite, Redis limiter when Redis answers, billing's real ledger):
"inline" (the gateway writes the ledger from a background thread) and "queue" (it RPUSHes usage
events and `manage.py usage_consume` writes them), and a bare uvicorn+httpx proxy as the floor of
what any Python HTTP hop costs here. Latency: sequential keep-alive requests, cycling through every
path each iteration so all see the same machine load. Rate: N concurrent clients for D seconds.
Writes benchmarks/results/gateway.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import gateway_refusals
from benchmarks.common import cpu_seconds, db_step, percentile, stop_processes, write_results

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.3):
            return True
    except OSError:
        return False


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def prepare_database(env: dict[str, str], model: str) -> dict[str, str]:
    """Migrate a fresh database, price the model, create an unlimited bench tenant and a free-tier
    tenant allowed 2 requests a minute; returns their keys ("bench", "free")."""
    return db_step(env, "gateway_tenants", model=model)


_bare_client: httpx.AsyncClient | None = None


async def bare_proxy(scope, receive, send):
    """Reference point: the least an HTTP hop in Python costs here (uvicorn + httpx, no auth,
    limits, routing or metering). Served as `uvicorn benchmarks.gateway:bare_proxy`."""
    global _bare_client
    if scope["type"] != "http":
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        return
    if _bare_client is None:
        _bare_client = httpx.AsyncClient(base_url=os.environ["BARE_UPSTREAM"], trust_env=False)
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    incoming = dict(scope["headers"])
    headers = {"content-type": "application/json"}
    if b"authorization" in incoming:
        headers["authorization"] = incoming[b"authorization"].decode()
    r = await _bare_client.request(scope["method"], scope["path"], content=body, headers=headers)
    await send({"type": "http.response.start", "status": r.status_code,
                "headers": [(b"content-type", r.headers.get("content-type", "application/json").encode())]})
    await send({"type": "http.response.body", "body": r.content})


PATHS = ("direct", "inline", "queue", "bare")


def latency(urls: dict[str, str], headers: dict[str, dict], model: str, n: int, expect: dict[str, int]) -> dict:
    """`expect`: the status each path must answer once warm ("refused": 429 past the free tier's 2 RPM)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
    samples: dict[str, list[float]] = {name: [] for name in urls}
    clients = {name: httpx.Client(timeout=30) for name in urls}
    try:
        for i in range(n + 50):
            for name, url in urls.items():
                t0 = time.perf_counter()
                r = clients[name].post(f"{url}/v1/chat/completions", json=body, headers=headers[name])
                elapsed = (time.perf_counter() - t0) * 1000
                if i < 50:  # warm-up excluded
                    continue
                if r.status_code != expect.get(name, 200):
                    raise RuntimeError(f"{name}: {r.status_code} {r.text[:200]}")
                samples[name].append(elapsed)
    finally:
        for client in clients.values():
            client.close()
    out = {name: {"p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99), "n": len(v)} for name, v in samples.items()}
    for name in urls:
        if name not in ("direct", "refused"):
            out[name]["added_p50_ms"] = out[name]["p50_ms"] - out["direct"]["p50_ms"]
            out[name]["added_p99_ms"] = out[name]["p99_ms"] - out["direct"]["p99_ms"]
    return out


async def _rate(url: str, headers: dict, model: str, concurrency: int, seconds: float) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
    done, errors = 0, 0
    statuses: dict[str, int] = {}
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def loop():
            nonlocal done, errors
            while time.perf_counter() < stop:
                r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                if r.status_code == 200:
                    done += 1
                else:
                    errors += 1
                    statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"requests_per_s": done / elapsed, "errors": errors, "error_statuses": statuses,
            "concurrency": concurrency, "seconds": elapsed}


def _good_p50(url: str, headers: dict, model: str, n: int) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
    samples = []
    with httpx.Client(timeout=30) as client:
        for i in range(n + 20):
            t0 = time.perf_counter()
            r = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            if r.status_code != 200:
                raise RuntimeError(f"good key during the flood: {r.status_code} {r.text[:200]}")
            if i >= 20:
                samples.append((time.perf_counter() - t0) * 1000)
    return percentile(samples, 50)


def auth_flood(url: str, headers: dict, model: str, n: int) -> dict:
    """A good key's p50 alone, then while another local address (127.0.0.2) floods /v1/models with
    made-up keys from 8 connections (the flooder of tests/controlplane/test_auth_throttle_flood.py)."""
    quiet = _good_p50(url, headers, model, n)
    flooder = subprocess.Popen([sys.executable, "-m", "tests.controlplane.test_auth_throttle_flood", "--flood", url,
                                "--seconds", "300", "--concurrency", "8", "--address", "127.0.0.2"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        flooder.stdout.readline()
        time.sleep(0.5)  # past the allowed burst
        flooded = _good_p50(url, headers, model, n)
        flooder.send_signal(signal.SIGTERM)
        report = json.loads(flooder.communicate(timeout=30)[0])
    finally:
        if flooder.poll() is None:
            flooder.kill()
    return {"quiet_p50_ms": quiet, "flooded_p50_ms": flooded, "flood": report}


def start_gateway(usage_queue: str, upstream: str, args, tmp: str, procs: list,
                  name: str = "") -> tuple[str, dict[str, str], dict, int]:
    """A gateway process (and its consumer for the queue); returns (url, keys, env, pid)."""
    name = name or usage_queue
    limiter = "redis" if redis_up() else "database"
    if usage_queue == "redis" and limiter != "redis":
        raise SystemExit("the Redis usage queue needs Redis on 127.0.0.1:6379")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.base",
        "TESSERA_VAR_DIR": tmp,
        "DATABASE_URL": f"sqlite:///{tmp}/{name}.sqlite3",
        "TESSERA_WORKERS": upstream,
        "TESSERA_WORKER_TOKEN": args.worker_token,
        "TESSERA_LIMITER": limiter,
        "TESSERA_USAGE_QUEUE": usage_queue,
        "REDIS_URL": "redis://127.0.0.1:6379/0" if limiter == "redis" else "",
        "TESSERA_REDIS_PREFIX": f"tsrbench{os.getpid()}{name}",
        "TESSERA_LOG_LEVEL": "WARNING",
    }
    keys = prepare_database(env, args.model)
    port = free_port()
    gateway = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--no-access-log", "--log-level", "warning"], cwd=ROOT, env=env)
    procs.append(gateway)
    if usage_queue == "redis":
        procs.append(subprocess.Popen([sys.executable, "manage.py", "usage_consume"], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/v1/models")
    return url, keys, env, gateway.pid


def ledger_rows(env: dict) -> int:
    return db_step(env, "ledger_rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker-url", help="a running worker (default: start the fake upstream)")
    parser.add_argument("--worker-token", default=os.environ.get("TESSERA_WORKER_TOKEN", ""))
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--requests", type=int, default=500, help="latency samples per path")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--name", default="gateway", help="results file stem under benchmarks/results/")
    parser.add_argument("--flood-concurrency", type=int, default=48, help="the over-limit tenant's connections")
    parser.add_argument("--flood-seconds", type=float, default=6.0, help="the flood timed for CPU per refusal")
    parser.add_argument("--premium-requests", type=int, default=150, help="premium streams timed per phase")
    parser.add_argument("--token-delay", type=float, default=0.05,
                        help="seconds per token of the slowed fake upstream behind the flood's gateway")
    args = parser.parse_args()

    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="tessera-bench-")
    load_before = os.getloadavg()[0]
    try:
        if args.worker_url:
            upstream, upstream_kind = args.worker_url.rstrip("/"), "real worker (dataplane.worker)"
        else:
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.controlplane.fake_worker", "--port", str(port)],
                                          cwd=ROOT))
            upstream = f"http://127.0.0.1:{port}"
            upstream_kind = "fake upstream (tests/controlplane/fake_worker.py), not a real model"
        wait_http(f"{upstream}/health")
        # The refusal and flood figures: a gateway of their own in front of a fake worker slowed per token.
        slow_port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.controlplane.fake_worker", "--port",
                                       str(slow_port), "--token-delay", str(args.token_delay)], cwd=ROOT))
        slow_upstream = f"http://127.0.0.1:{slow_port}"
        wait_http(f"{slow_upstream}/health")
        inline_url, inline_keys, inline_env, inline_pid = start_gateway("inline", upstream, args, tmp, procs)
        queue_url, queue_keys, queue_env, queue_pid = start_gateway("redis", upstream, args, tmp, procs)
        flood_url, flood_keys, _, flood_pid = start_gateway("inline", slow_upstream, args, tmp, procs, name="flood")
        inline_key, queue_key = inline_keys["bench"], queue_keys["bench"]
        bare_port = free_port()
        bare = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "benchmarks.gateway:bare_proxy", "--host", "127.0.0.1", "--port",
             str(bare_port), "--no-access-log", "--log-level", "warning"], cwd=ROOT,
            env={**os.environ, "BARE_UPSTREAM": upstream})
        procs.append(bare)
        bare_url = f"http://127.0.0.1:{bare_port}"
        wait_http(f"{bare_url}/v1/models")
        floor_port = free_port()
        floor = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "benchmarks.gateway_refusals:refuse_all", "--host", "127.0.0.1", "--port",
             str(floor_port), "--no-access-log", "--log-level", "warning"], cwd=ROOT)
        procs.append(floor)
        floor_url = f"http://127.0.0.1:{floor_port}"
        wait_http(f"{floor_url}/health")

        worker_headers = {"Authorization": f"Bearer {args.worker_token}"} if args.worker_token else {}
        urls = {"direct": upstream, "inline": inline_url, "queue": queue_url, "bare": bare_url, "refused": flood_url}
        headers = {"direct": worker_headers, "inline": {"Authorization": f"Bearer {inline_key}"},
                   "queue": {"Authorization": f"Bearer {queue_key}"}, "bare": worker_headers,
                   "refused": {"Authorization": f"Bearer {flood_keys['free']}"}}
        pids = {"inline": inline_pid, "queue": queue_pid, "bare": bare.pid, "refused": flood_pid}
        idle0, t_idle = cpu_seconds(flood_pid), time.perf_counter()
        time.sleep(3.0)  # what an idle gateway burns (worker polling): the sequential CPU figures include it
        idle_ms_per_s = (cpu_seconds(flood_pid) - idle0) * 1000 / (time.perf_counter() - t_idle)
        cpu0, t_lat = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.perf_counter()
        lat = latency(urls, headers, args.model, args.requests, expect={"refused": 429})
        cpu = {name: (cpu_seconds(pid) - cpu0[name]) / (args.requests + 50) * 1000 for name, pid in pids.items()}
        idle_ms_per_request = idle_ms_per_s * (time.perf_counter() - t_lat) / (args.requests + 50)
        rate = {name: asyncio.run(_rate(urls[name], headers[name], args.model, args.concurrency, args.seconds))
                for name in PATHS}
        flood = auth_flood(inline_url, headers["inline"], args.model, args.requests)
        flood_cpu = gateway_refusals.refusal_cpu(flood_url, flood_pid, flood_keys["free"], args.flood_concurrency,
                                                 args.flood_seconds)
        floor_cpu = gateway_refusals.refusal_cpu(floor_url, floor.pid, flood_keys["free"], args.flood_concurrency,
                                                 args.flood_seconds)
        premium = gateway_refusals.premium_under_flood(flood_url, flood_keys["bench"], flood_keys["free"], args.model,
                                                       args.premium_requests, 4, args.flood_concurrency, floor_url)
        time.sleep(1.0)  # let the consumer catch up before counting the ledger
        rows_written = {"inline": ledger_rows(inline_env), "queue": ledger_rows(queue_env)}
        limiter = inline_env["TESSERA_LIMITER"]
    finally:
        stop_processes(procs, 10)

    data = {
        "upstream": upstream_kind, "model": args.model, "limiter": limiter, "database": "sqlite",
        "gateway_processes": 1, "cpus": os.cpu_count(), "latency": lat, "gateway_cpu_ms_per_request": cpu,
        "rate": rate, "ledger_rows": rows_written, "auth_flood": flood,
        "refusals": {"sequential": {"cpu_ms": cpu["refused"], **lat["refused"]}, "flood": flood_cpu, "floor_flood": floor_cpu,
                     "idle_gateway_cpu_ms_per_s": idle_ms_per_s, "idle_cpu_ms_per_sequential_request": idle_ms_per_request,
                     "premium_under_flood": premium, "token_delay_s": args.token_delay},
        "targets": {"added_p50_ms": 3.0, "added_p99_ms": 10.0, "refusal_cpu_ms": 0.5, "premium_ttft_p95_ratio": 1.5},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average_1m": [load_before, os.getloadavg()[0]],
    }
    labels = {"direct": "direct to the upstream", "inline": "gateway, ledger written inline (default)",
              "queue": "gateway, Redis usage queue + usage_consume", "bare": "bare uvicorn+httpx proxy (floor)"}

    def cell(name: str, key: str) -> str:
        value = lat[name].get(key)
        return "" if value is None else f"{value:.2f}"

    rows = [
        f"| {labels[n]} | {cell(n, 'p50_ms')} | {cell(n, 'p99_ms')} | {cell(n, 'added_p50_ms')} | "
        f"{cell(n, 'added_p99_ms')} | {cpu[n]:.2f} |" if n in cpu else
        f"| {labels[n]} | {cell(n, 'p50_ms')} | {cell(n, 'p99_ms')} | {cell(n, 'added_p50_ms')} | "
        f"{cell(n, 'added_p99_ms')} | |"
        for n in PATHS
    ]
    rate_rows = [f"| {labels[n]} | {rate[n]['requests_per_s']:.0f} | {rate[n]['errors']} {rate[n]['error_statuses'] or ''} |"
                 for n in PATHS]
    table = "\n".join([
        "# Gateway overhead",
        "",
        f"Upstream: {upstream_kind}; model `{args.model}`, `max_tokens=1`. Each gateway is one uvicorn process "
        f"({limiter} limiter, SQLite, billing's real ledger ingest, API-key auth on every request). "
        f"{os.cpu_count()} CPUs shared by the load generator, the gateways, the upstream and the ledger writers "
        f"(and by other work: 1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after). "
        "Compare each gateway with the bare proxy measured in the same interleaved run.",
        "",
        "| path | p50 (ms) | p99 (ms) | added p50 (ms) | added p99 (ms) | proxy CPU/request (ms) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Targets: added p50 ≤ 3 ms, added p99 ≤ 10 ms. {args.requests} sequential keep-alive requests per path after "
        "50 warm-up, the paths interleaved request by request.",
        "",
        f"| path | authenticated requests/s ({args.concurrency} concurrent clients, {args.seconds:.0f} s) | errors |",
        "|---|---|---|",
        *rate_rows,
        "",
        f"Ledger rows written: inline {rows_written['inline']}, queue {rows_written['queue']} "
        "(every served request exactly once). Command: `python -m benchmarks.gateway`.",
        "",
        f"Failed-key flood: {flood['flood']['requests'] / flood['flood']['seconds']:.0f} requests/s of made-up keys on "
        f"/v1/models from another address (8 connections; {flood['flood']['statuses']}); the inline gateway's p50 for a "
        f"good key {flood['quiet_p50_ms']:.2f} ms alone, {flood['flooded_p50_ms']:.2f} ms during the flood.",
        "",
        *gateway_refusals.table_lines(lat, cpu, flood_cpu, floor_cpu, premium, args.token_delay, idle_ms_per_request),
    ])
    write_results(args.name, data, table)
    print(table)


if __name__ == "__main__":
    main()
