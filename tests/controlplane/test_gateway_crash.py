"""A gateway killed mid-stream (kill -9: OOM, a rollout past the grace period) loses no usage.

The gateway runs as its own process (uvicorn, the deployed ASGI app) on the test database; the
worker is the fake one in this process. After SIGKILL the request's journal row and its
reservation are still there; the sweeper bills what the worker generated and frees the seat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
from django.conf import settings
from django.db import connection

from billing.models import UsageRecord
from controlplane.gateway.models import InflightRequest
from tenants.models import BudgetPeriod, Reservation
from tests.dataplane.worker.process import free_port

from .test_live_gateway import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def gateway_process(gateway, workers):
    if connection.vendor != "postgresql":
        pytest.skip("the gateway process shares the test database: PostgreSQL")
    db = settings.DATABASES["default"]
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.base",  # the test settings pin TESSERA_WORKERS empty
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "TESSERA_API_KEY_SECRET": settings.TESSERA_API_KEY_SECRET,  # the keys' hashes must match
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TESSERA_WORKERS": workers[0].url,
        "TESSERA_WORKER_TOKEN": "worker-secret",
        "TESSERA_LIMITER": "database",
        "TESSERA_USAGE_SINK": "billing.services.usage_record_ingest",
    }
    log = tempfile.NamedTemporaryFile(prefix="gateway-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, open(log.name).read()[-3000:]
            try:
                httpx.get(url + "/v1/models", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the gateway process did not start"
                time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_kill_9_mid_stream_then_the_sweeper_bills_the_workers_counts(gateway_process, gateway, tenant_key, workers):
    proc, url = gateway_process
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the sweeper writes the real ledger
    tenant, secret = tenant_key.sync(max_concurrent_requests=1, monthly_token_budget=100_000)
    worker = workers[0]
    worker.token_delay = 0.05
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 400,
            "stream": True}
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {secret}"}) as response:
            request_id = response.headers["x-request-id"]
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data: ")
                if seen == 5:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                    break

    # Right afterwards: no usage, the reservation still charged and holding the only seat...
    wait_for(lambda: request_id in worker.disconnected, timeout=30)  # the worker dropped the request with the connection
    assert not UsageRecord.objects.filter(request_id=request_id).exists()
    assert Reservation.objects.filter(request_id=request_id).exists()
    row = InflightRequest.objects.get(request_id=request_id)
    assert row.worker_url == worker.url and row.tenant_id == tenant.pk

    # ...until the sweeper runs (beat: every minute).
    from django.core.management import call_command

    call_command("usage_sweep", "--min-age", "0")
    generated = worker.usage[request_id]["completion_tokens"]
    record = UsageRecord.objects.get(request_id=request_id)
    assert record.completion_tokens == generated >= 5 and record.prompt_tokens == 7 and record.tenant_id == tenant.pk
    assert not Reservation.objects.filter(tenant_id=tenant.pk).exists()  # the seat is free again
    assert BudgetPeriod.objects.get(tenant_id=tenant.pk).tokens == 7 + generated  # the budget holds what was served
    assert not InflightRequest.objects.exists()
