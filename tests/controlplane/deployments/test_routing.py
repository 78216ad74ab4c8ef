"""The gateway routes from the deployments registry: ready replicas on ready workers; adapters only
for their tenant. Workers are the gateway tests' fake OpenAI-shaped servers."""

from __future__ import annotations

import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

pytestmark = pytest.mark.django_db(transaction=True)


def auth(secret: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {secret}"}}


def setup_registry(worker_urls: list[str]) -> dict:
    """Two workers; a ready replica of `fake-model` on each; Acme's adapter ready on the first."""
    from controlplane.deployments import reconciler, services
    from controlplane.deployments.models import AdapterPlacement, Replica
    from tenants import services as tenant_services

    tier = tenant_services.tier_create(name=f"routing-{uuid.uuid4().hex[:6]}", priority=0)
    acme, acme_key = tenant_services.tenant_create_with_key(name="Acme", tier=tier)
    _, other_key = tenant_services.tenant_create_with_key(name="Other", tier=tier)
    workers = [services.worker_register(name=f"w{i}", url=url, boot_id="b", status="ready")
               for i, url in enumerate(worker_urls)]
    model = services.model_create(name="fake-base", source="/models/fake")
    services.deployment_create(model=model, replicas=2, served_name="fake-model", max_adapters=1)
    reconciler.reconcile()
    for replica in Replica.objects.all():
        services.replica_report(worker=replica.worker, replica_id=replica.pk, attempt=1, status="ready")
    services.adapter_create(tenant=acme, name="sql", base_model=model, source="sql")
    reconciler.reconcile()
    placement = AdapterPlacement.objects.get(replica__worker=workers[0])
    AdapterPlacement.objects.exclude(pk=placement.pk).delete()
    services.placement_report(worker=workers[0], placement_id=placement.pk, attempt=1, status="ready")
    return {"acme": acme_key.secret, "other": other_key.secret, "workers": workers}


@pytest.fixture
def registry_gateway(gateway, workers):
    from controlplane.gateway.routing import workers as registry_module

    gateway.TESSERA_WORKERS = ""  # the deployments registry, not a static list
    registry_module._registry = None
    yield gateway
    registry_module._registry = None


async def models_of(client: AsyncClient, secret: str) -> list[str]:
    response = await client.get("/v1/models", **auth(secret))
    return sorted(m["id"] for m in response.json()["data"])


async def test_routes_come_from_the_registry_and_adapters_stay_with_their_tenant(registry_gateway, workers, drain):
    from controlplane.gateway.routing.workers import get_registry

    setup = await sync_to_async(setup_registry)([w.url for w in workers])
    client = AsyncClient()
    assert await models_of(client, setup["acme"]) == ["acme:sql", "fake-model"]
    assert await models_of(client, setup["other"]) == ["fake-model"]
    body = {"model": "acme:sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refused = await client.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                                **auth(setup["other"]))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    served = await client.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                               **auth(setup["acme"]))
    assert served.status_code == 200
    assert [r.body["model"] for r in workers[0].received] == ["acme:sql"] and not workers[1].received
    await drain()

    from controlplane.deployments import services

    await sync_to_async(services.worker_heartbeat)(worker=setup["workers"][0], boot_id="b", status="draining")
    await get_registry().refresh()
    assert [w.url for w in get_registry().candidates("fake-model")] == [workers[1].url]
    assert await models_of(client, setup["acme"]) == ["fake-model"]  # the adapter's only host is draining


async def test_an_unreachable_worker_stays_out_of_rotation_until_the_registry_drops_it(registry_gateway, workers):
    from controlplane.gateway.routing.workers import get_registry

    await sync_to_async(setup_registry)([w.url for w in workers])
    registry = get_registry()
    await registry.ensure_polling()
    first = registry.candidates("fake-model")[0]
    first.mark_failed()
    await registry.refresh()  # the table still lists it (its heartbeat has not lapsed)
    assert first.url not in {w.url for w in registry.candidates("fake-model")}
