"""A brute force against a real gateway process: one address floods /v1/models with made-up keys while a
tenant with a good key, from another address, keeps sending chat completions.

Processes: the gateway (uvicorn + controlplane.asgi, production settings, the test database, the Redis
limiter), the fake worker (tests/controlplane/fake_worker.py) and the flooder (this module run as a
script, bound to 127.0.0.2). The good key's requests are timed from this process (127.0.0.1), once
without the flood and once during it, and the p50s compared: the flood must get 429s (at most the
allowed burst plus the refill as 401s) and must not slow the good tenant (p50 with it < 3x without +
20 ms). The same measurement against a gateway with the throttle off is printed for comparison.

    python -m tests.controlplane.test_auth_throttle_flood --flood URL --seconds S --concurrency C --address A
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 20
FLOOD_ADDRESS = "127.0.0.2"
FLOOD_SECONDS = 60.0  # at most: the test stops the flood once the good key's requests are done
FLOOD_CONCURRENCY = 8
GOOD_REQUESTS = 150
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def _free_port() -> int:
    from tests.dataplane.worker.process import free_port

    return free_port()


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer:\n{log.read_text(errors='replace')[-3000:]}")


@contextmanager
def _process(argv: list[str], env: dict[str, str], ready_url: str):
    log = Path(tempfile.mkstemp(prefix="auth-flood-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(ready_url, proc, log)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)


@contextmanager
def _gateway(worker_url: str, redis_url: str, failures_per_minute: int):
    from django.conf import settings

    from tests.controlplane.deployments.live import database_url

    port = _free_port()
    var = tempfile.mkdtemp(prefix="tessera-flood-")
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "DATABASE_URL": database_url(),
        "TESSERA_API_KEY_SECRET": settings.TESSERA_API_KEY_SECRET, "TESSERA_VAR_DIR": var,
        "TESSERA_WORKERS": worker_url, "TESSERA_WORKER_TOKEN": "worker-secret", "TESSERA_WORKER_POLL_SECONDS": "0.5",
        "TESSERA_LIMITER": "redis", "REDIS_URL": redis_url, "TESSERA_REDIS_PREFIX": f"tsrtest-{uuid.uuid4().hex[:10]}",
        "TESSERA_USAGE_SINK": "tests.controlplane.sink.collect", "TESSERA_TRUSTED_PROXY_HOPS": "0",
        "TESSERA_AUTH_FAILURES_PER_MINUTE": str(failures_per_minute), "TESSERA_LOG_LEVEL": "ERROR",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--port", str(port),
            "--log-level", "warning", "--no-access-log"]
    base = f"http://127.0.0.1:{port}"
    with _process(argv, env, base + "/healthz"):
        yield base


def _good_p50(base: str, secret: str, n: int) -> tuple[float, Counter]:
    latencies, statuses = [], Counter()
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.1"), timeout=10) as client:
        for _ in range(n):
            started = time.perf_counter()
            response = client.post(f"{base}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {secret}"})
            latencies.append((time.perf_counter() - started) * 1000)
            statuses[response.status_code] += 1
    latencies.sort()
    return latencies[len(latencies) // 2], statuses


def _measure(base: str, secret: str) -> dict:
    """The good key's p50 without and then with the flood, and what the flood got."""
    deadline = time.monotonic() + 30
    while _good_p50(base, secret, 1)[1][200] != 1:  # the gateway has polled the worker and serves
        assert time.monotonic() < deadline, "the gateway never served the good key"
        time.sleep(0.2)
    _good_p50(base, secret, 20)  # warm: connections, the key cache, the limiter's scripts
    quiet, quiet_statuses = _good_p50(base, secret, GOOD_REQUESTS)
    flooder = subprocess.Popen(
        [sys.executable, "-m", "tests.controlplane.test_auth_throttle_flood", "--flood", base, "--seconds",
         str(FLOOD_SECONDS), "--concurrency", str(FLOOD_CONCURRENCY), "--address", FLOOD_ADDRESS],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert flooder.stdout.readline().strip() == "flooding"
        time.sleep(0.5)  # past the burst: the address is being refused
        flooded, flooded_statuses = _good_p50(base, secret, GOOD_REQUESTS)
        assert flooder.poll() is None, "the flood ended before the good key's requests did"
        flooder.send_signal(signal.SIGTERM)  # the flood stops and reports
        report = json.loads(flooder.communicate(timeout=30)[0])
    finally:
        if flooder.poll() is None:
            flooder.kill()
    return {"quiet_p50_ms": quiet, "flooded_p50_ms": flooded, "good": quiet_statuses + flooded_statuses,
            "flood": report}


def test_a_brute_force_gets_429s_and_does_not_slow_a_good_key(settings, redis_url, tenant_key):
    _, secret = tenant_key.sync()
    worker_port = _free_port()
    worker_url = f"http://127.0.0.1:{worker_port}"
    with _process([sys.executable, "-m", "tests.controlplane.fake_worker", "--port", str(worker_port)],
                  dict(os.environ), worker_url + "/health"):
        with _gateway(worker_url, redis_url, LIMIT) as base:
            on = _measure(base, secret)
        with _gateway(worker_url, redis_url, 0) as base:
            off = _measure(base, secret)

    for name, m in (("throttle on", on), ("throttle off", off)):
        flood = m["flood"]
        print(f"\n{name}: good key p50 {m['quiet_p50_ms']:.2f} ms alone, {m['flooded_p50_ms']:.2f} ms during the "
              f"flood; flood {flood['requests']} requests in {flood['seconds']:.1f} s "
              f"({flood['requests'] / flood['seconds']:.0f}/s) from {FLOOD_CONCURRENCY} connections: {flood['statuses']}")

    flood = on["flood"]["statuses"]
    allowed_401s = LIMIT + on["flood"]["seconds"] * LIMIT / 60 + 1  # the burst, then the refill
    assert flood.get("401", 0) <= allowed_401s, flood
    assert flood.get("429", 0) >= 5 * LIMIT, flood  # the flood went on well past the burst, refused
    assert set(flood) <= {"401", "429"}, flood
    assert set(on["good"]) == {200} and on["good"][200] == 2 * GOOD_REQUESTS
    assert off["flood"]["statuses"].get("429", 0) == 0  # the comparison run really had no throttle
    assert on["flooded_p50_ms"] < 3 * on["quiet_p50_ms"] + 20, on


# --- the flooder (run as a script by the test) --------------------------------------------------------------


async def _flood(base: str, seconds: float, concurrency: int, address: str, key: str | None = None) -> dict:
    """Made-up keys on /v1/models; or, given `key`, chat completions with that (valid) key: the
    over-limit tenant of benchmarks/gateway_refusals.py."""
    statuses: Counter = Counter()
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(transport=transport, timeout=10,
                                 limits=httpx.Limits(max_connections=concurrency)) as client:
        done = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
        print("flooding", flush=True)
        started = time.monotonic()
        stop = started + seconds

        async def one_connection():
            while time.monotonic() < stop and not done.is_set():
                try:
                    if key is None:
                        made_up = "sk-" + uuid.uuid4().hex + uuid.uuid4().hex
                        response = await client.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {made_up}"})
                    else:
                        response = await client.post(f"{base}/v1/chat/completions", json=BODY,
                                                     headers={"Authorization": f"Bearer {key}"})
                    statuses[str(response.status_code)] += 1
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1

        await asyncio.gather(*(one_connection() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    return {"requests": sum(statuses.values()), "seconds": elapsed, "statuses": dict(statuses)}


def main() -> None:
    parser = argparse.ArgumentParser(description="Flood a gateway: made-up keys on /v1/models, or one key's chat completions.")
    parser.add_argument("--flood", required=True, help="the gateway's base URL")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--address", default="127.0.0.2", help="the local address the flood comes from")
    parser.add_argument("--key", help="flood chat completions with this key instead of made-up keys on /v1/models")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_flood(args.flood, args.seconds, args.concurrency, args.address, args.key))), flush=True)


if __name__ == "__main__":
    main()
