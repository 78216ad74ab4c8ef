"""Billing fixtures: tenants and keys through the tenants services, prices, usage events, a fake Stripe."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

# Django models are imported inside fixtures: this conftest loads before Django is set up.

NOV = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def make_tenant(db):
    from tenants import services

    def make(**fields):
        tier = services.tier_create(name=f"t-{uuid.uuid4().hex[:8]}", priority=5)
        fields.setdefault("name", f"Tenant {uuid.uuid4().hex[:6]}")
        return services.tenant_create(tier=tier, **fields)

    return make


@pytest.fixture
def tenant(make_tenant):
    return make_tenant()


@pytest.fixture
def api_key(tenant):
    from tenants import services

    return services.api_key_create(tenant=tenant, name="prod").key


@pytest.fixture
def make_price(db):
    from billing import services

    def make(model="llama-8b", *, inp="0.15", cached="0.075", out="0.60", start=NOV, end=None, **scope):
        return services.price_create(
            model=model, input_per_mtok=Decimal(inp), cached_input_per_mtok=Decimal(cached),
            output_per_mtok=Decimal(out), effective_from=start, effective_to=end, **scope,
        )

    return make


@pytest.fixture
def price(make_price):
    return make_price()


@pytest.fixture
def make_event(tenant, api_key):
    from billing.events import UsageEvent

    def make(**fields):
        base = dict(
            request_id=f"req-{uuid.uuid4().hex}", tenant_id=tenant.pk, api_key_id=api_key.pk, model="llama-8b",
            adapter=None, tier="standard", prompt_tokens=1000, cached_tokens=200, completion_tokens=300,
            ttft_ms=12.5, latency_ms=340.0, status="ok", created_at=datetime(2026, 11, 10, 12, tzinfo=UTC),
        )
        base.update(fields)
        return UsageEvent(**base)

    return make


@pytest.fixture
def ingest():
    from billing.services import usage_record_ingest

    return lambda event: usage_record_ingest(event=event)


@pytest.fixture
def fake_stripe(settings):
    """Stripe's API stand-in on a local port, with the SDK pointed at it through settings."""
    from tests.billing.fake_stripe import FakeStripe

    server = FakeStripe().start()
    settings.STRIPE_API_KEY = "sk_test_local"
    settings.STRIPE_API_BASE = server.url
    settings.STRIPE_MAX_NETWORK_RETRIES = 2
    yield server
    server.stop()


@pytest.fixture
def no_retry_sleep(monkeypatch):
    """The SDK sleeps 0.5 s or more between network retries; tests do not need to wait."""
    import stripe

    monkeypatch.setattr(stripe._http_client.HTTPClient, "_sleep_time_seconds", lambda self, n, *a, **k: 0)


@pytest.fixture
def eager_celery():
    """Run .delay() inline, autoretry included (Celery re-applies a retried eager task at once);
    `.get()` on the result raises the task's final error."""
    from controlplane.celery import app

    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield app
    app.conf.task_always_eager = previous
