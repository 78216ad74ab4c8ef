"""Under ASGI (how the control plane is served) the middleware runs async and the view in a thread:
the actor and origin still reach the service that records."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient

pytestmark = pytest.mark.django_db(transaction=True)


async def test_asgi_request_records_its_actor(make_user):
    from controlplane.audit.models import AuditEvent
    from tenants import services

    await sync_to_async(services.tier_create)(name="asgi-tier", priority=3)
    operator = await sync_to_async(make_user)("ops-asgi", role="operator")
    client = AsyncClient()
    await client.aforce_login(operator)
    response = await client.patch("/api/v1/tiers/asgi-tier/", {"priority": 2}, content_type="application/json")
    assert response.status_code == 200, response.content
    event = await AuditEvent.objects.aget(action="tier.update")
    assert (event.actor, event.channel, event.client_address) == ("user:ops-asgi", "api", "127.0.0.1")
    assert event.request_id == response["X-Request-Id"] and event.changes == {"priority": [3, 2]}
    await sync_to_async(connections.close_all)()  # the view's thread's connection, before the flush
