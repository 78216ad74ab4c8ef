"""The Celery broker goes away for seconds: the management API still answers, what was asked for
during the outage is applied once the broker is back (once: no second load), and beat and the
reconciler neither crash nor flood their log meanwhile.

Real parts: the control plane (uvicorn, a Celery worker with embedded beat) on the suite's test
database, a throwaway redis-server as the broker (killed and restarted empty: queued messages are
lost, the worst case), and a managed worker process (the real agent: registration, heartbeats, the
consumer of its queue, the real worker-side tasks) whose engine slot builds nothing and counts builds
(outage_agent.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from tests.throwaway_services import ThrowawayRedis, throwaway_redis  # noqa: F401 (fixture)

from .live import ROOT, Process, Stack, operator_client, wait_for

pytestmark = [pytest.mark.slow]

# Longer outages: TESSERA_TEST_BROKER_OUTAGE_SECONDS=60 (Celery's reconnect backoff grows to 30 s).
OUTAGE_SECONDS = float(os.environ.get("TESSERA_TEST_BROKER_OUTAGE_SECONDS", "12"))


@pytest.fixture
def stack(throwaway_redis, transactional_db):  # noqa: F811
    stack = Stack(throwaway_redis.url)
    stack.broker = throwaway_redis
    try:
        for suffix in ("a", "b"):
            name = f"stub-{stack.run_id}-{suffix}"
            env = {**stack.env, "TESSERA_CONTROL_PLANE_URL": stack.url, "TESSERA_WORKER_ID": name,
                   "TESSERA_BROKER_URL": throwaway_redis.url, "TESSERA_HEARTBEAT_SECONDS": "0.5"}
            env.pop("DATABASE_URL")
            stack.workers[name] = Process(name, [sys.executable, "-m", "tests.controlplane.deployments.outage_agent"],
                                          env)
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()


def worker_stats(name: str) -> dict:
    from controlplane.deployments.models import Worker

    return Worker.objects.get(name=name).stats


def _log_lines(stack: Stack, process: int) -> list[str]:
    """The lines a control-plane process has written so far (0: web, 1: Celery worker with beat)."""
    return [line for line in stack.processes[process].logs(tail=10**8).splitlines() if line.strip()]


def test_a_deployment_and_an_adapter_asked_for_while_the_broker_is_down_are_applied_once_it_is_back(stack):
    from controlplane.deployments.models import Adapter, Replica, Worker
    from tenants import services

    broker: ThrowawayRedis = stack.broker
    first, second = stack.workers
    wait_for(lambda: Worker.objects.filter(name__in=stack.workers, status="ready").count() == 2, 60,
             "the workers to register", stack)
    api = operator_client(stack, username=f"op-{uuid.uuid4().hex[:6]}")
    for name in ("m1", "m2"):
        made = api.post("/models/", json={"name": name})
        assert made.status_code == 201, made.text

    # The first deployment is ready on the first worker, with an adapter slot, before the outage.
    assert api.post("/deployments/", json={"model": "m1", "replicas": 1, "max_adapters": 2,
                                           "placement": {"workers": [first]}}).status_code == 201
    wait_for(lambda: Replica.objects.filter(deployment__name="m1", status="ready").exists(), 30, "m1 ready", stack)
    # A tier of its own: a transactional test run before this one may have flushed the seeded tiers.
    tier = services.tier_create(name=f"tier-{uuid.uuid4().hex[:8]}", priority=5)
    tenant, key = services.tenant_create_with_key(name=f"T {uuid.uuid4().hex[:6]}", tier=tier)

    celery_before, web_before = len(_log_lines(stack, 1)), len(_log_lines(stack, 0))
    broker.stop()
    outage_started = time.monotonic()
    made = httpx.post(stack.url + "/api/v1/adapters/", headers={"Authorization": f"Bearer {key.secret}"},
                      json={"name": "colour", "base_model": "m1", "source": "colour", "rank": 4}, timeout=30)
    answered_in = time.monotonic() - outage_started
    assert made.status_code == 201, made.text
    assert answered_in < 5, f"the API waited {answered_in:.1f} s for the broker"
    deployed = api.post("/deployments/", json={"model": "m2", "replicas": 1})  # for the second worker
    assert deployed.status_code == 201, deployed.text
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - outage_started)))
    during = _log_lines(stack, 1)[celery_before:]
    web_during = _log_lines(stack, 0)[web_before:]

    broker.start()
    back = time.monotonic()
    recovered: dict[str, float] = {}

    def applied() -> bool:
        if "adapter" not in recovered and Adapter.objects.get(pk=made.json()["id"]).status == "ready":
            recovered["adapter"] = time.monotonic() - back
        if "deployment" not in recovered and Replica.objects.filter(deployment__name="m2", status="ready").exists():
            recovered["deployment"] = time.monotonic() - back
        return len(recovered) == 2

    wait_for(applied, 60, "the adapter and the deployment to be applied after the broker came back", stack,
             interval=0.05)
    print(f"\nbroker back after {OUTAGE_SECONDS:.0f} s -> adapter ready in {recovered['adapter']:.2f} s, "
          f"deployment ready in {recovered['deployment']:.2f} s; log lines during the outage: celery "
          f"{len(during)}, web {len(web_during)}; the API answered in {answered_in:.2f} s")
    for name in stack.workers:
        wait_for(lambda name=name: worker_stats(name).get("engine_builds"), 10, f"a heartbeat from {name}", stack)
    wait_for(lambda: worker_stats(first).get("adapter_loads"), 10, "a heartbeat that shows the adapter", stack)
    time.sleep(3)  # a few more reconcile passes and heartbeats: a second load would show by now
    assert worker_stats(first)["adapter_loads"] == 1 and worker_stats(first)["engine_builds"] == 1
    assert worker_stats(second)["engine_builds"] == 1 and worker_stats(second)["tasks"]["load_model"] == 1
    assert Adapter.objects.get(pk=made.json()["id"]).served_name in Worker.objects.get(name=first).loaded_adapters
    assert list(Replica.objects.order_by("deployment__name").values_list("attempt", flat=True)) == [1, 1]

    # Bounded logs: beat says the broker went away once (not a traceback per tick), the web process
    # says it once for both requests' messages, and Celery's own reconnect lines back off.
    assert not [line for line in during if "Traceback" in line], "\n".join(during)
    assert sum('"the Celery broker (beat) unavailable"' in line for line in during) == 1, "\n".join(during)
    assert len(during) < 40 + OUTAGE_SECONDS, "\n".join(during)
    assert sum("the Celery broker unavailable" in line for line in web_during) == 1, "\n".join(web_during)
    assert not [line for line in web_during if "Traceback" in line], "\n".join(web_during)
    api.close()


PUBLISH_WHILE_HUNG = """
import json, os, sys, time
import django
django.setup()
from controlplane.deployments import dispatch
took = []
for _ in range(3):
    started = time.monotonic()
    dispatch.send(dispatch.RECONCILE, [], None, expires=30)
    took.append(time.monotonic() - started)
print(json.dumps(took))
"""


def test_a_hung_broker_costs_a_write_seconds_not_minutes_and_one_log_line(throwaway_redis):  # noqa: F811
    """SIGSTOP: the broker's port accepts connections and nothing answers (a partition, a stuck server)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "CELERY_BROKER_URL": throwaway_redis.url,
           "PYTHONPATH": str(ROOT)}
    throwaway_redis.pause()
    try:
        done = subprocess.run([sys.executable, "-c", PUBLISH_WHILE_HUNG], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        throwaway_redis.resume()
    assert done.returncode == 0, done.stderr
    took = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\npublishing to a hung broker took {', '.join(f'{t:.1f} s' for t in took)}")
    assert took[0] < 12 and max(took[1:]) < 6, took  # the first tries with retries; later ones once
    lines = [line for line in done.stderr.splitlines() if '"the Celery broker' in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("app_path", ["controlplane.celery", "dataplane.worker.agent.tasks"])
def test_consumers_retry_a_missing_broker_every_few_seconds_not_every_30(app_path):
    """What a Celery consumer does when its broker is gone (the call and arguments of celery's Consumer)."""
    import importlib

    from tests.dataplane.worker.process import free_port

    app = importlib.import_module(app_path).app
    waits: list[float] = []
    connection = app.connection_for_read(url=f"redis://127.0.0.1:{free_port()}/0")  # nobody listens there
    with pytest.raises(Exception):  # noqa: B017 - kombu's OperationalError once the retries are spent
        connection.ensure_connection(lambda exc, interval: waits.append(interval), 3, callback=lambda: None)
    connection.release()
    assert waits == [1, 2, 3], waits  # kombu's own default: 2, 4, 6 ... 30
