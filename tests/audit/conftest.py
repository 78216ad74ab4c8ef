"""Audit-log fixtures: billing's (tenants, prices, usage, a fake Stripe, eager Celery) plus clients."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from tests.billing.conftest import (  # noqa: F401  (fixtures)
    api_key,
    eager_celery,
    fake_stripe,
    ingest,
    make_event,
    make_price,
    make_tenant,
    no_retry_sleep,
    price,
    tenant,
)


@pytest.fixture
def no_broker(monkeypatch):
    from controlplane.deployments import dispatch

    monkeypatch.setattr(dispatch, "send", lambda *args, **kwargs: None)


def as_key(secret: str) -> APIClient:
    client = APIClient(REMOTE_ADDR="198.51.100.7")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def as_user(user, address: str = "203.0.113.9") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.force_login(user)
    return client


def events(action: str, **filters):
    from controlplane.audit.models import AuditEvent

    return list(AuditEvent.objects.filter(action=action, **filters).order_by("id"))


def one(action: str, **filters):
    found = events(action, **filters)
    assert len(found) == 1, (action, filters, [(e.action, e.object_id) for e in found])
    return found[0]


def holds_no_secret(event, *secrets: str) -> bool:
    text = json.dumps({f.name: str(getattr(event, f.name)) for f in event._meta.fields}) + json.dumps(event.changes)
    return all(secret and secret not in text for secret in secrets)
