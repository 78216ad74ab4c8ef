"""The gateway names the tenant and its tier's fair-share weight to the worker (issue 18)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError
from django.test import AsyncClient

from .test_gateway import CHAT, post

CHAT_JSON = json.dumps(CHAT)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_the_worker_hears_the_tenant_and_its_tiers_weight(gateway, tenant_key, workers, drain):
    heavy, heavy_secret = await tenant_key(fair_share_weight=3)
    plain, plain_secret = await tenant_key()  # the default weight
    for secret in (heavy_secret, plain_secret):
        response = await post(AsyncClient(), secret, CHAT)
        assert response.status_code == 200, response.content
    received = [r.headers for w in workers for r in w.received]
    assert sorted((h["x-tenant-id"], h["x-tenant-weight"]) for h in received) == sorted(
        [(heavy.slug, "3"), (plain.slug, "1")])
    assert all(h["x-tenant-id"] != h["x-cache-salt"] for h in received)  # the key is not the secret salt
    await drain()


async def test_a_weight_workers_would_refuse_cannot_be_stored(gateway, tenant_key):
    from tenants.models import Tier

    tenant, _ = await tenant_key()
    tier = await sync_to_async(lambda: tenant.tier)()
    for bad in (0, 1001):
        tier.fair_share_weight = bad
        with pytest.raises(IntegrityError):
            await sync_to_async(tier.save)()
    assert await sync_to_async(lambda: Tier.objects.get(pk=tier.pk).fair_share_weight)() == 1


async def test_the_worker_hears_the_prefill_worker_the_routing_table_names(gateway, tenant_key, workers, drain):
    """Disaggregated serving: the gateway names a deployment's prefill replica to the serving worker it picks
    (controlplane/deployments/selectors.routing_table sets Worker.prefill); a client cannot name one."""
    from controlplane.gateway.routing.workers import get_registry

    _, secret = await tenant_key()
    smuggled = await AsyncClient().post("/v1/chat/completions", data=CHAT_JSON, content_type="application/json",
                                        headers={"Authorization": f"Bearer {secret}",
                                                 "X-Tessera-Prefill-Url": "http://attacker.test:1"})
    assert smuggled.status_code == 200, smuggled.content
    for w in get_registry().workers:
        w.prefill = {CHAT["model"]: "http://prefill.test:8100"}
    named = await post(AsyncClient(), secret, CHAT)
    assert named.status_code == 200, named.content
    received = [r.headers for w in workers for r in w.received]
    assert sorted(h.get("x-tessera-prefill-url") or "" for h in received) == ["", "http://prefill.test:8100"]
    await drain()
