"""A managing key grants at most what it holds: create, update and rotate stay within its scopes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services

pytestmark = pytest.mark.django_db


def as_key(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def tenant(make_tenant):
    return make_tenant()


@pytest.fixture
def soon():
    return timezone.now() + timedelta(days=7)


@pytest.fixture
def narrow(tenant, soon):
    """A managing key limited to model a, adapter x, expiring in a week."""
    return services.api_key_create(
        tenant=tenant, name="narrow", allowed_models=["a"], allowed_adapters=["x"], expires_at=soon, can_manage=True
    )


def refused(response, field: str) -> None:
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["code"] == "scope_exceeds_key" and body["param"] == field and body["detail"].startswith(f"{field}:")


def within(soon, **fields) -> dict:
    return {"name": "child", "allowed_models": ["a"], "allowed_adapters": ["x"], "expires_at": soon.isoformat(), **fields}


def test_a_narrow_key_mints_keys_within_its_scopes(narrow, soon):
    client = as_key(narrow.secret)
    response = client.post("/api/v1/keys/", within(soon, can_manage=True), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["can_manage"] is True  # may grant can_manage, within its own scopes
    earlier = (soon - timedelta(days=1)).isoformat()
    assert client.post("/api/v1/keys/", within(soon, expires_at=earlier), format="json").status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"allowed_models": []}, "allowed_models"),  # unrestricted
        ({"allowed_models": ["b"]}, "allowed_models"),
        ({"allowed_models": ["a", "b"]}, "allowed_models"),
        ({"allowed_adapters": []}, "allowed_adapters"),
        ({"allowed_adapters": ["y"]}, "allowed_adapters"),
        ({"expires_at": None}, "expires_at"),
        ("later", "expires_at"),
    ],
)
def test_a_narrow_key_cannot_mint_a_wider_key(narrow, soon, change, field):
    if change == "later":
        change = {"expires_at": (soon + timedelta(days=1)).isoformat()}
    response = as_key(narrow.secret).post("/api/v1/keys/", within(soon, **change), format="json")
    refused(response, field)


def test_omitted_scopes_mean_unrestricted_and_are_refused(narrow):
    refused(as_key(narrow.secret).post("/api/v1/keys/", {"name": "child"}, format="json"), "allowed_models")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"allowed_models": []}, "allowed_models"),
        ({"allowed_models": ["a", "b"]}, "allowed_models"),
        ({"allowed_adapters": []}, "allowed_adapters"),
        ({"expires_at": None}, "expires_at"),
        ("later", "expires_at"),
    ],
)
def test_a_key_cannot_widen_itself(narrow, soon, change, field):
    if change == "later":
        change = {"expires_at": (soon + timedelta(days=30)).isoformat()}
    response = as_key(narrow.secret).patch(f"/api/v1/keys/{narrow.key.pk}/", change, format="json")
    refused(response, field)
    narrow.key.refresh_from_db()
    assert narrow.key.allowed_models == ["a"] and narrow.key.allowed_adapters == ["x"]
    assert narrow.key.expires_at == soon


def test_a_key_may_narrow_itself_and_rename_wider_keys(narrow, tenant, soon):
    client = as_key(narrow.secret)
    earlier = soon - timedelta(days=1)
    response = client.patch(f"/api/v1/keys/{narrow.key.pk}/", {"expires_at": earlier.isoformat()}, format="json")
    assert response.status_code == 200
    wide = services.api_key_create(tenant=tenant, name="wide")
    assert client.patch(f"/api/v1/keys/{wide.key.pk}/", {"name": "renamed"}, format="json").status_code == 200
    assert client.patch(f"/api/v1/keys/{wide.key.pk}/", {"allowed_models": ["a"]}, format="json").status_code == 200
    refused(client.patch(f"/api/v1/keys/{wide.key.pk}/", {"allowed_models": ["b"]}, format="json"), "allowed_models")


def test_a_narrow_key_cannot_rotate_a_wider_key(narrow, tenant):
    wide = services.api_key_create(tenant=tenant, name="wide", can_manage=True)
    refused(as_key(narrow.secret).post(f"/api/v1/keys/{wide.key.pk}/rotate/", {}, format="json"), "allowed_models")
    wide.key.refresh_from_db()
    assert wide.key.expires_at is None  # untouched


def test_a_narrow_key_may_rotate_itself(narrow):
    response = as_key(narrow.secret).post(f"/api/v1/keys/{narrow.key.pk}/rotate/", {}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["allowed_models"] == ["a"]


def test_an_unrestricted_key_and_operators_are_not_bounded(tenant, make_user):
    wide = services.api_key_create(tenant=tenant, name="wide", can_manage=True)
    response = as_key(wide.secret).post("/api/v1/keys/", {"name": "any", "can_manage": True}, format="json")
    assert response.status_code == 201
    operator = APIClient()
    operator.force_authenticate(make_user("op", role="operator"))
    response = operator.post(f"/api/v1/tenants/{tenant.slug}/keys/", {"name": "any"}, format="json")
    assert response.status_code == 201
