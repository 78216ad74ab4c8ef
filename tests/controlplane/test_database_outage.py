"""PostgreSQL or Redis stopped for seconds under steady traffic (issue #21's reproductions, against real parts).

A gateway process (uvicorn, the deployed ASGI app, production settings module) runs on a throwaway
PostgreSQL cluster of its own, with the Redis limiter, in front of the fake workers of this process.
A few clients send chat completions (streamed and not) without pause; the test stops PostgreSQL for
OUTAGE seconds, starts it again, and checks: no 500 at any time; requests keep being served from
memory (keys) with usage spooled locally; and once the database is back every request a client saw
served is in the ledger, once, with exactly the tokens the client was told. The recovery time (the
database back → the spool drained into the ledger) is printed.

Redis (the limiter's store, a throwaway redis-server without persistence) stopped the same way:
requests are refused with 503 + Retry-After while it is down (the documented policy: no limit is
enforced from memory, so no budget can be overrun), served again as soon as it is back, and the
month's counter it lost is seeded again from the ledger, equal to it once the sweeper has settled
what Redis missed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.dataplane.worker.process import free_port
from tests.throwaway_services import ROOT, throwaway_postgres, throwaway_redis  # noqa: F401 (fixtures)

from .test_live_gateway import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

OUTAGE = 10.0  # seconds PostgreSQL is down
CLIENTS = 4


def _env(db_url: str, redis_url: str, spool_dir: Path, workers) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.base",
        "DJANGO_SECRET_KEY": "outage-test-secret",
        "TESSERA_API_KEY_SECRET": "outage-test-key-secret",
        "DATABASE_URL": db_url,
        "REDIS_URL": redis_url,
        "TESSERA_LIMITER": "redis",
        "TESSERA_REDIS_PREFIX": f"tsr-outage-{uuid.uuid4().hex[:8]}",
        "TESSERA_WORKERS": ",".join(w.url for w in workers),
        "TESSERA_WORKER_TOKEN": "worker-secret",
        "TESSERA_USAGE_SINK": "billing.services.usage_record_ingest",
        "TESSERA_USAGE_SPOOL_DIR": str(spool_dir),
        "TESSERA_DB_CONNECT_TIMEOUT": "2",
        "TESSERA_VAR_DIR": str(spool_dir.parent / "var"),
    }


def _manage(env: dict, *args: str) -> dict:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}


def _start_gateway(env: dict):
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="gateway-outage-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: proc.poll() is None and _up(url), timeout=60)
    return proc, url, log.name


@pytest.fixture
def limiter_redis(request, redis_url) -> str:
    """The shared Redis, or a throwaway one for a test that stops it (marked `blinking_redis`)."""
    if request.node.get_closest_marker("blinking_redis"):
        return request.getfixturevalue("throwaway_redis").url
    return redis_url


@pytest.fixture
def outage_setup(throwaway_postgres, limiter_redis, workers, tmp_path):  # noqa: F811
    """(env, key secret, the throwaway PostgreSQL, spool dir, start()): start() runs a gateway process."""
    throwaway_postgres.migrate()
    env = _env(throwaway_postgres.url, limiter_redis, tmp_path / "spool", workers)
    _manage(env, "tenant_create", "--name", "Blink Co", "--slug", "blink", "--tier", "enterprise")
    secret = _manage(env, "key_create", "--tenant", "blink", "--name", "steady")["api_key"]
    procs = []

    def start():
        proc, url, log = _start_gateway(env)
        procs.append(proc)
        return proc, url, log

    yield env, secret, throwaway_postgres, tmp_path / "spool", start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.fixture
def outage_gateway(outage_setup):
    env, secret, postgres, spool_dir, start = outage_setup
    _, url, log = start()
    return url, secret, postgres, spool_dir, log


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Traffic:
    """Clients calling without pause; each outcome is (phase, status, request id, usage the client was told)."""

    def __init__(self, url: str, secret: str) -> None:
        self.url, self.secret = url, secret
        self.phase = "before"
        self.outcomes: list[tuple[str, int, str, dict | None, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _client(self, index: int) -> None:
        headers = {"Authorization": f"Bearer {self.secret}"}
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"client {index} says hello"}],
                "max_tokens": 4}
        with httpx.Client(timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                stream = n % 2 == 0
                phase = self.phase
                try:
                    if stream:
                        usage, status, rid, text = None, 0, "", ""
                        payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
                        with client.stream("POST", f"{self.url}/v1/chat/completions", json=payload,
                                           headers=headers) as response:
                            status, rid = response.status_code, response.headers.get("x-request-id", "")
                            for line in response.iter_lines():
                                text += line + "\n"
                                if line.startswith("data: {") and '"usage"' in line:
                                    chunk = json.loads(line[6:])
                                    usage = chunk.get("usage") or usage
                        self.outcomes.append((phase, status, rid, usage, text[-500:], time.monotonic()))
                    else:
                        response = client.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
                        usage = response.json().get("usage") if response.status_code == 200 else None
                        self.outcomes.append((phase, response.status_code, response.headers.get("x-request-id", ""),
                                              usage, response.text[-500:], time.monotonic()))
                except httpx.HTTPError as exc:
                    self.outcomes.append((phase, -1, "", None, repr(exc), time.monotonic()))
                    time.sleep(0.05)


def _ledger(db_url: str) -> dict[str, tuple[int, int]]:
    with psycopg.connect(db_url.replace("postgres://", "postgresql://"), connect_timeout=5) as conn:
        rows = conn.execute("SELECT request_id, prompt_tokens, completion_tokens FROM billing_usagerecord").fetchall()
        journal = conn.execute("SELECT count(*) FROM gateway_inflightrequest").fetchone()[0]
    counts = Counter(r[0] for r in rows)
    assert not [rid for rid, n in counts.items() if n > 1], "a request was billed twice"
    return {r[0]: (r[1], r[2]) for r in rows}, journal


def _spool_bytes(spool_dir: Path) -> int:
    total = 0
    for path in spool_dir.glob("*.spool") if spool_dir.is_dir() else ():
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # drained and removed by the gateway between the listing and the stat
            pass
    return total


def test_postgres_stopped_for_seconds_under_traffic_no_500_and_every_served_request_billed(outage_gateway):
    url, secret, postgres, spool_dir, log_path = outage_gateway
    with Traffic(url, secret) as traffic:
        time.sleep(3)
        traffic.phase = "during"
        postgres.stop()
        stopped = time.monotonic()
        time.sleep(OUTAGE)
        assert _spool_bytes(spool_dir) > 0, "nothing was spooled while the database was down"
        traffic.phase = "after"
        postgres.start()
        started = time.monotonic()
        print(f"\nPostgreSQL was down {started - stopped:.1f} s")
        wait_for(lambda: _spool_bytes(spool_dir) == 0, timeout=60)
        drained = time.monotonic() - started
        time.sleep(2)
    outcomes = traffic.outcomes
    by_phase = {p: Counter(o[1] for o in outcomes if o[0] == p) for p in ("before", "during", "after")}
    print(f"status codes by phase: {by_phase}; spool drained {drained:.2f} s after PostgreSQL was back")
    log = Path(log_path).read_text(errors="replace")
    assert all(o[1] in (200, 503) for o in outcomes), [o for o in outcomes if o[1] not in (200, 503)][:3]
    assert by_phase["during"][200] > 20 and by_phase["during"][200] >= 0.95 * sum(by_phase["during"].values()), by_phase
    for _, status, _, _, text, _ in outcomes:
        if status == 503:
            assert "temporarily" in text or "retry" in text.lower(), text

    served = {o[2]: o[3] for o in outcomes if o[1] == 200}
    assert all(usage for usage in served.values()), "a served request without usage"
    # Every request a client saw served reaches the ledger with the tokens it was told; the journal empties.
    deadline = time.monotonic() + 60
    while True:
        ledger, journal = _ledger(postgres.url)
        missing = [rid for rid in served if rid not in ledger]
        if not missing and journal == 0:
            break
        assert time.monotonic() < deadline, (f"{len(missing)} served requests not in the ledger, "
                                             f"{journal} journal rows left; log tail:\n{log[-3000:]}")
        time.sleep(0.5)
    for rid, usage in served.items():
        assert ledger[rid] == (usage["prompt_tokens"], usage["completion_tokens"]), rid
    assert "usage event NOT recorded" not in log


def test_a_gateway_killed_while_the_database_is_away_loses_no_usage(outage_setup, workers):
    """kill -9 with usage in the spool and requests in flight: a gateway started on the same host replays the
    dead one's spool (its lock is free), the sweeper finishes what was in flight, and every request a
    client saw served is billed once with the tokens it was told."""
    import signal

    env, secret, postgres, spool_dir, start = outage_setup
    first, url, _ = start()
    with Traffic(url, secret) as traffic:
        time.sleep(1)
        postgres.stop()
        time.sleep(4)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    served = {o[2]: o[3] for o in traffic.outcomes if o[1] == 200}
    assert len(served) > 20 and _spool_bytes(spool_dir) > 0
    postgres.start()
    _, url2, log2 = start()  # the same host's next gateway: it finds the dead one's file unlocked
    started = time.monotonic()
    ok = httpx.post(f"{url2}/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"}, timeout=30,
                    json={"model": "fake-model", "messages": [{"role": "user", "content": "after"}], "max_tokens": 2})
    assert ok.status_code == 200
    served[ok.headers["x-request-id"]] = ok.json()["usage"]
    wait_for(lambda: _spool_bytes(spool_dir) == 0 and not list(spool_dir.glob("*.spool")), timeout=60)
    print(f"\nthe dead gateway's spool replayed {time.monotonic() - started:.2f} s after the new one started")
    _manage(env, "usage_sweep", "--min-age", "0")  # requests in flight when it died: billed from the worker
    ledger, journal = _ledger(postgres.url)
    assert journal == 0
    missing = [rid for rid in served if rid not in ledger]
    assert not missing, f"{len(missing)} of {len(served)} served requests not billed"
    for rid, usage in served.items():
        assert ledger[rid] == (usage["prompt_tokens"], usage["completion_tokens"]), rid


@pytest.mark.blinking_redis
def test_redis_stopped_for_seconds_under_traffic_503_then_served_and_the_counter_rebuilt(outage_setup, request):
    import redis

    env, secret, postgres, spool_dir, start = outage_setup
    server = request.getfixturevalue("throwaway_redis")
    _, url, log_path = start()
    with Traffic(url, secret) as traffic:
        time.sleep(3)
        traffic.phase = "during"
        server.stop()
        time.sleep(OUTAGE)
        traffic.phase = "after"
        server.start()  # empty: no persistence, as after a failover to a cold replica
        started = time.monotonic()
        wait_for(lambda: any(o[0] == "after" and o[1] == 200 and o[5] > started for o in traffic.outcomes), timeout=30)
        recovered = max(0.0, min(o[5] for o in traffic.outcomes if o[0] == "after" and o[1] == 200) - started)
        time.sleep(3)
    outcomes = traffic.outcomes
    by_phase = {p: Counter(o[1] for o in outcomes if o[0] == p) for p in ("before", "during", "after")}
    print(f"\nstatus codes by phase: {by_phase}; first 200 {recovered:.2f} s after Redis was back")
    assert all(o[1] in (200, 503) for o in outcomes), [o for o in outcomes if o[1] not in (200, 503)][:3]
    assert by_phase["during"][503] > 20
    # What was admitted before the outage may finish during it; nothing is admitted while Redis is down.
    assert by_phase["during"][200] <= CLIENTS, by_phase
    for o in outcomes:
        if o[1] == 503:
            assert "temporarily unavailable" in o[4], o[4]
    served = {o[2]: o[3] for o in outcomes if o[1] == 200}
    _manage(env, "usage_sweep", "--min-age", "0")  # settles what Redis missed (journal rows kept for it)
    ledger, journal = _ledger(postgres.url)
    assert journal == 0
    assert all(rid in ledger and ledger[rid] == (u["prompt_tokens"], u["completion_tokens"]) for rid, u in served.items())
    client = redis.Redis.from_url(server.url)
    (month_key,) = client.keys(f"{env['TESSERA_REDIS_PREFIX']}:*:m:*")
    assert int(client.hget(month_key, "tok")) == sum(p + c for p, c in ledger.values())  # rebuilt, and exact
