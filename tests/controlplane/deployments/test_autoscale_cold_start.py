"""Scale to zero, then a request: 503 + Retry-After in OpenAI's shape, the deployment wakes (once),
and once its replica is ready the next request is served. Workers are the gateway tests' fake servers."""

from __future__ import annotations

import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def auth(secret: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {secret}"}}


@pytest.fixture
def registry_gateway(gateway, workers):
    from controlplane.gateway.routing import workers as registry_module

    gateway.TESSERA_WORKERS = ""  # the deployments registry, not a static list
    gateway.TESSERA_AUTOSCALE_COLD_START_RETRY_SECONDS = 7
    registry_module._registry = None
    yield gateway
    registry_module._registry = None


def setup_at_zero(worker_url: str) -> dict:
    from controlplane.deployments import services
    from tenants import services as tenant_services

    tier = tenant_services.tier_create(name=f"cold-{uuid.uuid4().hex[:6]}", priority=0)
    acme, acme_key = tenant_services.tenant_create_with_key(name="Acme", tier=tier)
    _, other_key = tenant_services.tenant_create_with_key(name="Other", tier=tier)
    worker = services.worker_register(name="w0", url=worker_url, boot_id="b", status="ready")
    model = services.model_create(name="fake-base", source="/models/fake")
    deployment = services.deployment_create(model=model, replicas=0, served_name="fake-model", min_replicas=0,
                                            max_replicas=2, max_adapters=1)
    services.adapter_create(tenant=acme, name="sql", base_model=model, source="sql")
    return {"acme": acme_key.secret, "other": other_key.secret, "worker": worker, "deployment": deployment}


def bring_up(worker) -> None:
    from controlplane.deployments import reconciler, services
    from controlplane.deployments.models import Replica

    reconciler.reconcile()
    replica = Replica.objects.get()
    services.replica_report(worker=worker, replica_id=replica.pk, attempt=replica.attempt, status="ready")


def desired() -> tuple[int, list[dict]]:
    from controlplane.audit.models import AuditEvent
    from controlplane.deployments.models import Deployment

    events = [e.changes for e in AuditEvent.objects.filter(action="deployment.autoscale").order_by("id")]
    return Deployment.objects.get().desired_replicas, events


async def test_a_request_at_zero_is_refused_with_retry_after_and_wakes_the_deployment_once(
        registry_gateway, workers, drain, monkeypatch):
    from controlplane.deployments import dispatch
    from controlplane.gateway.routing.workers import get_registry

    monkeypatch.setattr(dispatch, "send", lambda *args, **kwargs: None)  # no broker; the reconciler runs below
    setup = await sync_to_async(setup_at_zero)(workers[0].url)
    client = AsyncClient()
    post = {"data": json.dumps(BODY), "content_type": "application/json"}
    refused = await client.post("/v1/chat/completions", **post, **auth(setup["acme"]))
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "7"
    error = refused.json()["error"]
    assert error["code"] == "model_cold_start" and error["type"] and "scaled to zero" in error["message"]
    count, events = await sync_to_async(desired)()
    assert count == 1 and [e["reason"] for e in events] == [[None, "cold_start"]]

    get_registry().waker._last.clear()  # past this process's once-a-second guard: the service itself is idempotent
    again = await client.post("/v1/chat/completions", **post, **auth(setup["other"]))
    assert again.status_code == 503 and again.json()["error"]["code"] == "model_cold_start"
    assert (await sync_to_async(desired)())[0] == 1 and len((await sync_to_async(desired)())[1]) == 1

    # Another tenant's adapter on the sleeping base is still invisible to everyone else.
    adapter = {**BODY, "model": "acme:sql"}
    hidden = await client.post("/v1/chat/completions", data=json.dumps(adapter), content_type="application/json",
                               **auth(setup["other"]))
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
    assert not workers[0].received

    await sync_to_async(bring_up)(setup["worker"])
    await get_registry().refresh()
    served = await client.post("/v1/chat/completions", **post, **auth(setup["acme"]))
    assert served.status_code == 200 and [r.body["model"] for r in workers[0].received] == ["fake-model"]
    await drain()


async def test_an_unknown_model_is_still_a_404(registry_gateway, workers):
    setup = await sync_to_async(setup_at_zero)(workers[0].url)
    body = {**BODY, "model": "nope"}
    response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(body),
                                        content_type="application/json", **auth(setup["acme"]))
    assert response.status_code == 404
