"""The gateway names the tenant and its tier's fair-share weight to the worker (issue 18)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError
from django.test import AsyncClient

from .test_gateway import CHAT, post

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
