"""A dependency that blinks: clients get 503 + Retry-After in OpenAI's shape, never a 500, and
service comes back by itself.

Redis is a throwaway `redis-server` on a spare port that the test stops and starts again under
traffic (the binary is on the development and CI machines). PostgreSQL is the suite's own server,
which cannot be stopped under the other tests: its error path is checked with a real driver error
from a server that is not there.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest
import redis

from tests.dataplane.worker.process import free_port

from .test_live_gateway import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}


class ThrowawayRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def _answers(self) -> bool:
        try:
            return redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping()
        except redis.exceptions.ConnectionError:
            return False


@pytest.fixture
def blinking_redis(gateway):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    from tenants.limits import reset_limiter

    server = ThrowawayRedis()
    server.start()
    gateway.TESSERA_LIMITER, gateway.REDIS_URL = "redis", server.url
    reset_limiter()
    yield server
    server.stop()


def test_redis_down_is_a_503_with_retry_after_and_service_returns_by_itself(blinking_redis, live_gateway, tenant_key):
    _, secret = tenant_key.sync(requests_per_minute=10_000)
    headers = {"Authorization": f"Bearer {secret}"}

    def call() -> httpx.Response:
        return httpx.post(f"{live_gateway}/v1/chat/completions", json=BODY, headers=headers, timeout=10)

    assert call().status_code == 200
    blinking_redis.stop()
    during = [call() for _ in range(5)]
    assert {r.status_code for r in during} == {503}, [r.text for r in during]
    for response in during:
        assert int(response.headers["retry-after"]) >= 1 and response.headers["x-request-id"]
        assert response.json()["error"]["code"] == "service_unavailable"
        assert response.json()["error"]["type"] == "server_error"
    blinking_redis.start()
    deadline = time.monotonic() + 15
    while (status := call().status_code) != 200:
        assert status == 503 and time.monotonic() < deadline, status
        time.sleep(0.2)


def test_a_database_that_does_not_answer_is_a_503(gateway):
    """The error a real driver raises for an unreachable server maps to the 503, and a bug stays a 500."""
    import psycopg
    from django.db import OperationalError

    from controlplane.gateway import outages

    try:
        psycopg.connect(host="127.0.0.1", port=free_port(), user="postgres", connect_timeout=2)
    except psycopg.OperationalError as driver_error:
        try:
            raise OperationalError(str(driver_error)) from driver_error  # as Django's wrapper raises it
        except OperationalError as exc:
            error = outages.unavailable(exc, "req_x")
    assert error is not None and error.status == 503 and error.headers["Retry-After"] == "2"
    assert outages.dependency_of(redis.exceptions.ConnectionError("gone")) == "redis"
    assert outages.unavailable(KeyError("a bug"), "req_y") is None


def test_readiness_follows_redis_and_liveness_does_not(blinking_redis, client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "checks": {"database": "ok", "redis": "ok"}}
    blinking_redis.stop()
    down = client.get("/readyz")
    assert down.status_code == 503 and down.json()["checks"] == {"database": "ok", "redis": "unreachable"}
    assert down["Retry-After"] == "2"
    assert client.get("/healthz").status_code == 200  # a blink must not get the pod restarted
    blinking_redis.start()
    assert client.get("/readyz").status_code == 200


def test_readiness_without_redis_checks_the_database_only(settings, client):
    settings.REDIS_URL, settings.TESSERA_LIMITER, settings.TESSERA_USAGE_QUEUE = "", "database", "inline"
    assert client.get("/readyz").json() == {"status": "ready", "checks": {"database": "ok"}}


@pytest.mark.postgres
def test_the_database_check_against_a_server_that_is_not_there():
    """The default connection pointed at a port nobody listens on: not ready; pointed back: ready."""
    from django.db import connection

    from controlplane import health

    if connection.vendor != "postgresql":
        pytest.skip("a network database")
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(free_port())
    try:
        assert health.database_ok() is False
    finally:
        connection.settings_dict["PORT"] = port
        connection.close()
    assert health.database_ok() is True


def test_a_settlement_redis_missed_is_made_by_the_sweeper(blinking_redis, live_gateway, tenant_key, workers):
    """The issue's reproduction: with Redis gone when a request ended, its settlement was lost (the
    month counter kept the reservation instead of the usage, the seat stayed taken)."""
    import asyncio
    import signal
    import threading

    from controlplane.gateway.models import InflightRequest
    from controlplane.gateway.usage import sweeper
    from tenants.limits import get_limiter, period_start

    from . import sink

    tenant, secret = tenant_key.sync(monthly_token_budget=100_000, max_concurrent_requests=1)
    for worker in workers:
        worker.hold = threading.Event()
    outcome = {}
    call = threading.Thread(target=lambda: outcome.setdefault("response", httpx.post(
        f"{live_gateway}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {secret}"}, timeout=60)))
    call.start()
    wait_for(lambda: any(w.received for w in workers))
    blinking_redis.proc.send_signal(signal.SIGSTOP)  # Redis hangs: the settlement times out
    try:
        for worker in workers:
            worker.release()
        call.join(30)
        assert outcome["response"].status_code == 200
        wait_for(lambda: len(sink.EVENTS) == 1, timeout=60)  # the usage is written all the same...
        row = InflightRequest.objects.get()  # ...and the row kept, with what to settle
        assert row.unsettled_prompt_tokens == sink.EVENTS[0].prompt_tokens
    finally:
        blinking_redis.proc.send_signal(signal.SIGCONT)
    served = sink.EVENTS[0].prompt_tokens + sink.EVENTS[0].completion_tokens
    assert get_limiter().usage_sync(tenant_id=tenant.pk, period=period_start())[0] == row.reserved_tokens > served

    report = asyncio.run(sweeper.sweep(min_age=3600))  # beat's next sweep; no other row is old enough
    assert report.resettled == [row.request_id]
    assert get_limiter().usage_sync(tenant_id=tenant.pk, period=period_start())[0] == served
    assert not InflightRequest.objects.exists() and len(sink.EVENTS) == 1  # billed once
    for worker in workers:
        worker.hold = None
    again = httpx.post(f"{live_gateway}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {secret}"},
                       timeout=10)
    assert again.status_code == 200  # the only concurrency seat was given back


def test_a_redis_restart_without_persistence_keeps_a_hard_token_budget(blinking_redis, live_gateway, tenant_key, gateway):
    """Redis restarted empty (no persistence) lost the month's token counter: before the fix the counter
    started again at 0 and a tenant whose hard budget was spent was served again. Now it is seeded from
    the ledger (and the journal's in-flight reservations): refused as before the restart."""
    from billing.models import UsageRecord
    from tenants.limits import get_limiter, period_start, refusals

    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the real ledger: the seed reads it
    tenant, secret = tenant_key.sync(monthly_token_budget=400, budget_enforcement="hard")
    headers = {"Authorization": f"Bearer {secret}"}

    def call() -> httpx.Response:
        return httpx.post(f"{live_gateway}/v1/chat/completions", json=BODY, headers=headers, timeout=10)

    statuses = []
    while len(statuses) < 100 and (not statuses or statuses[-1] == 200):
        statuses.append(call().status_code)
        time.sleep(0.05)  # lets each settlement land, so the counter holds usage, not reservations
    served = statuses.count(200)
    assert statuses[-1] == 429 and served >= 3, statuses
    wait_for(lambda: UsageRecord.objects.filter(tenant=tenant).count() == served, timeout=20)
    used = sum(r.prompt_tokens + r.completion_tokens for r in UsageRecord.objects.filter(tenant=tenant))
    assert used <= 400

    blinking_redis.stop()
    blinking_redis.start()  # empty: no counter for this month any more
    time.sleep(refusals.CONCURRENCY_MEMORY_SECONDS)  # the refusal remembered before the restart has ended
    after = [call() for _ in range(6)]
    # The first call may meet a pooled connection the restart broke: a 503, which the client retries.
    after = after[1:] if after[0].status_code == 503 else after
    assert {r.status_code for r in after} == {429}, [r.text for r in after]
    assert all("budget" in r.json()["error"]["message"] for r in after), [r.text for r in after]
    assert get_limiter().usage_sync(tenant_id=tenant.pk, period=period_start())[0] == used  # re-seeded
    assert UsageRecord.objects.filter(tenant=tenant).count() == served
