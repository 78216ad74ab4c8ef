"""Autoscaling on the real stack: the control plane (uvicorn, Celery worker + beat), three managed
SmolLM2 CPU workers over Redis, load through the gateway. A step of load grows the deployment from 1,
and once the load stops it comes back to 1, with at most one change per cooldown.

Thresholds and clocks are shortened (env below) so that a run takes minutes, not the production
defaults' quarter hour; the decision is the same function."""

from __future__ import annotations

import os
import threading
import time
import uuid

import openai
import pytest
from django.core.management import call_command

from .live import MODEL, Stack, operator_client, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.redis, pytest.mark.usefixtures("live_database")]

BROKER = os.environ.get("TESSERA_TEST_BROKER_URL", "redis://127.0.0.1:6379/11")
CLOCKS = {"TESSERA_AUTOSCALE_TARGET_WAITING": "1", "TESSERA_AUTOSCALE_LOW_WAITING": "0.5",
          "TESSERA_AUTOSCALE_UP_COOLDOWN_SECONDS": "8", "TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS": "15",
          "TESSERA_AUTOSCALE_DOWN_STABLE_SECONDS": "15", "TESSERA_AUTOSCALE_KV_LOW": "0.9",
          "TESSERA_AUTOSCALE_KV_HIGH": "0.99", "TESSERA_AUTOSCALE_DRAIN_SECONDS": "30"}
GROW_WITHIN_S = 90  # from the load step to a second ready replica (two CPU model loads on 2 cores)
SHRINK_WITHIN_S = 120  # from the end of the load back to 1


@pytest.fixture(scope="module")
def stack(live_test_database, django_db_blocker):
    saved = {k: os.environ.get(k) for k in CLOCKS}
    os.environ.update(CLOCKS)  # Stack copies os.environ into every process it starts
    with django_db_blocker.unblock():
        stack = Stack(BROKER)
        try:
            for suffix in ("a", "b", "c"):
                stack.add_worker(suffix)
            stack.wait_ready()
            yield stack
        finally:
            stack.stop()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            call_command("flush", interactive=False, verbosity=0)


def desired() -> int:
    from controlplane.deployments.models import Deployment

    return Deployment.objects.get(name=MODEL).desired_replicas


def ready() -> int:
    from controlplane.deployments.models import Replica

    return Replica.objects.filter(deployment__name=MODEL, status="ready", drain_started_at__isnull=True).count()


def test_a_load_step_grows_the_deployment_and_it_shrinks_back_without_flapping(stack: Stack):
    from controlplane.audit.models import AuditEvent
    from controlplane.deployments.models import Worker
    from tenants import services

    wait_for(lambda: Worker.objects.filter(name__in=list(stack.workers), status="ready").count() == 3, 90,
             "the workers to register", stack)
    tier = services.tier_create(name=f"live-{uuid.uuid4().hex[:6]}", priority=0)
    _, key = services.tenant_create_with_key(name=f"Live {uuid.uuid4().hex[:6]}", tier=tier)
    api = operator_client(stack, username=f"op-{uuid.uuid4().hex[:6]}")
    assert api.post("/models/", json={"name": MODEL}).status_code == 201
    created = api.post("/deployments/", json={"model": MODEL, "replicas": 1, "min_replicas": 1, "max_replicas": 3,
                                               "engine_args": {"kv_cache_memory": "128MiB", "max_num_seqs": 1}})
    assert created.status_code == 201, created.text
    wait_for(lambda: ready() == 1, 120, "the first replica", stack)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=key.secret, max_retries=0, timeout=120)
    wait_for(lambda: client.models.list().data, 20, "the gateway to route", stack)

    stop = threading.Event()
    served = []

    def load() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to ten."}],
                                               max_tokens=24, temperature=0)
                served.append(1)
            except openai.APIError:
                time.sleep(0.2)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(6)]
    step = time.monotonic()
    for t in threads:
        t.start()
    try:
        wait_for(lambda: ready() >= 2, GROW_WITHIN_S, "a second ready replica under load", stack, interval=1)
        grown_after = time.monotonic() - step
    finally:
        stop.set()
        for t in threads:
            t.join(130)
    assert served
    end = time.monotonic()
    wait_for(lambda: desired() == 1 and ready() == 1, SHRINK_WITHIN_S, "back to one replica", stack, interval=1)
    shrunk_after = time.monotonic() - end
    events = list(AuditEvent.objects.filter(action="deployment.autoscale").order_by("at"))
    ups = [e for e in events if e.changes["desired_replicas"][1] > e.changes["desired_replicas"][0]]
    downs = [e for e in events if e.changes["desired_replicas"][1] < e.changes["desired_replicas"][0]]
    assert ups and downs and all(e.changes["signals"][1] for e in events)
    for kind, cooldown in ((ups, 8), (downs, 15)):
        gaps = [(b.at - a.at).total_seconds() for a, b in zip(kind, kind[1:], strict=False)]
        assert all(g >= cooldown - 1 for g in gaps), (kind, gaps)  # at most one change per cooldown
    print(f"\nlive autoscale: grew to 2 ready in {grown_after:.0f} s, back to 1 in {shrunk_after:.0f} s; "
          f"{len(ups)} up, {len(downs)} down; {len(served)} requests served")
    api.close()
