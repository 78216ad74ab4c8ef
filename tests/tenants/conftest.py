from __future__ import annotations

import uuid

import pytest

# Django models are imported inside fixtures: this conftest loads before Django is set up.

@pytest.fixture
def make_tier(db):
    from tenants import services

    def make(**fields):
        fields.setdefault("name", f"t-{uuid.uuid4().hex[:8]}")
        fields.setdefault("priority", 5)
        return services.tier_create(**fields)

    return make


@pytest.fixture
def make_tenant(db, make_tier):
    from tenants import services

    def make(tier=None, **fields):
        tier = tier or make_tier()
        fields.setdefault("name", f"Tenant {uuid.uuid4().hex[:6]}")
        return services.tenant_create(tier=tier, **fields)

    return make
