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
    refused(client.patch(f"/api/v1/keys/{wide.key.pk}/", {"allowed_models": ["b"]}, format="json"), "allowed_models")
    # Narrowing one field leaves a key this one could not have created (every adapter, no expiry): refused.
    refused(client.patch(f"/api/v1/keys/{wide.key.pk}/", {"allowed_models": ["a"]}, format="json"), "allowed_adapters")
    # Brought wholly within its own scopes, the wider key may be narrowed.
    response = client.patch(f"/api/v1/keys/{wide.key.pk}/", within(earlier), format="json")
    assert response.status_code == 200, response.content
    assert response.json()["allowed_adapters"] == ["x"]


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


# A change is judged by the key it leaves: the fields it does not send count as they stand.


@pytest.fixture
def wide(tenant):
    """An unrestricted key that never expires."""
    return services.api_key_create(tenant=tenant, name="wide", can_manage=True)


def assert_unchanged(key, expires_at) -> None:
    key.refresh_from_db()
    assert key.expires_at == expires_at and key.allowed_models == [] and key.allowed_adapters == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"expires_at": None}, "expires_at"),
        ("before_own", "allowed_models"),  # within its own expiry, but the key may use every model
        ({"name": "renamed", "expires_at": None}, "expires_at"),
    ],
)
def test_a_narrow_key_cannot_change_the_expiry_of_a_wider_key(narrow, wide, tenant, soon, change, field):
    """The issue's report: a key limited to model a cleared an unrestricted key's expiry."""
    limited = services.api_key_update(tenant=tenant, key=wide.key, expires_at=soon - timedelta(days=3))
    if change == "before_own":
        change = {"expires_at": (soon - timedelta(days=1)).isoformat()}
    refused(as_key(narrow.secret).patch(f"/api/v1/keys/{wide.key.pk}/", change, format="json"), field)
    assert_unchanged(wide.key, limited.expires_at)


@pytest.mark.parametrize("expires_at", [None, "before_own"])
def test_a_narrow_key_cannot_revive_a_wider_key_rotated_out(narrow, wide, tenant, soon, expires_at):
    services.api_key_rotate(tenant=tenant, key=wide.key, grace=timedelta(0))
    wide.key.refresh_from_db()
    ended = wide.key.expires_at
    assert not wide.key.is_usable()
    if expires_at == "before_own":
        expires_at = (soon - timedelta(days=1)).isoformat()
    response = as_key(narrow.secret).patch(f"/api/v1/keys/{wide.key.pk}/", {"expires_at": expires_at}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "scope_exceeds_key", response.content
    assert_unchanged(wide.key, ended)
    assert as_key(wide.secret).get("/api/v1/me/").status_code == 401  # still expired


def test_a_key_cannot_extend_another_key_beyond_its_own_expiry(narrow, tenant, soon):
    child = services.api_key_create(
        tenant=tenant, name="child", allowed_models=["a"], allowed_adapters=["x"], expires_at=soon - timedelta(days=1)
    )
    later = (soon + timedelta(days=1)).isoformat()
    client = as_key(narrow.secret)
    refused(client.patch(f"/api/v1/keys/{child.key.pk}/", {"expires_at": later}, format="json"), "expires_at")
    refused(client.patch(f"/api/v1/keys/{child.key.pk}/", {"expires_at": None}, format="json"), "expires_at")
    # An operator gave a key within its scopes a later expiry: this key may not re-scope it as it stands.
    services.api_key_update(tenant=tenant, key=child.key, expires_at=soon + timedelta(days=30))
    refused(client.patch(f"/api/v1/keys/{child.key.pk}/", {"allowed_models": ["a"]}, format="json"), "expires_at")
    child.key.refresh_from_db()
    assert child.key.expires_at == soon + timedelta(days=30)


def test_a_key_may_change_what_it_could_have_created(narrow, tenant, soon):
    child = services.api_key_create(
        tenant=tenant, name="child", allowed_models=["a"], allowed_adapters=["x"], expires_at=soon - timedelta(days=2)
    )
    client = as_key(narrow.secret)
    url = f"/api/v1/keys/{child.key.pk}/"
    response = client.patch(url, {"expires_at": soon.isoformat(), "allowed_adapters": ["x"]}, format="json")
    assert response.status_code == 200, response.content  # extended up to its own expiry
    # Rotated out and expired, it may be revived within its own expiry: it could create that key anew.
    services.api_key_rotate(tenant=tenant, key=child.key, grace=timedelta(0))
    response = client.patch(url, {"expires_at": (soon - timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 200, response.content
    child.key.refresh_from_db()
    assert child.key.is_usable()


def test_an_unrestricted_key_that_expires_cannot_clear_another_keys_expiry(wide, tenant, soon):
    expiring = services.api_key_create(tenant=tenant, name="expiring", expires_at=soon, can_manage=True)
    client = as_key(expiring.secret)
    refused(client.patch(f"/api/v1/keys/{wide.key.pk}/", {"allowed_models": ["a"]}, format="json"), "expires_at")
    assert_unchanged(wide.key, None)
    response = client.patch(f"/api/v1/keys/{wide.key.pk}/", {"expires_at": soon.isoformat()}, format="json")
    assert response.status_code == 200, response.content  # within its expiry, it may bound the other key


@pytest.fixture
def narrow_forever(tenant):
    """The issue's key: limited to one model, may manage, never expires (so no expiry bounds its own)."""
    return services.api_key_create(tenant=tenant, name="one-model", allowed_models=["a"], can_manage=True)


@pytest.mark.parametrize("rotated_out", [False, True])
def test_a_one_model_key_cannot_make_a_wider_key_never_expire(narrow_forever, wide, tenant, soon, rotated_out):
    if rotated_out:
        services.api_key_rotate(tenant=tenant, key=wide.key, grace=timedelta(0))
    else:
        services.api_key_update(tenant=tenant, key=wide.key, expires_at=soon)
    wide.key.refresh_from_db()
    ended = wide.key.expires_at
    client = as_key(narrow_forever.secret)
    refused(client.patch(f"/api/v1/keys/{wide.key.pk}/", {"expires_at": None}, format="json"), "allowed_models")
    later = (soon + timedelta(days=365)).isoformat()
    refused(client.patch(f"/api/v1/keys/{wide.key.pk}/", {"expires_at": later}, format="json"), "allowed_models")
    assert_unchanged(wide.key, ended)
    # Its own kind of key it may still keep alive for ever.
    child = services.api_key_create(tenant=tenant, name="child", allowed_models=["a"], expires_at=soon)
    response = client.patch(f"/api/v1/keys/{child.key.pk}/", {"expires_at": None}, format="json")
    assert response.status_code == 200 and response.json()["expires_at"] is None, response.content
