"""Management API: what tenants and operators can do, and that a tenant never reaches another's objects."""

from __future__ import annotations

import pytest
from django.urls import URLPattern, get_resolver
from rest_framework.test import APIClient

from tenants import services
from tenants.api import urls as api_urls
from tenants.models import APIKey, Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(make_tenant, django_user_model, make_user):
    a, b = make_tenant(slug="tenant-a"), make_tenant(slug="tenant-b")
    a_admin = services.api_key_create(tenant=a, name="a-admin", can_manage=True)
    a_plain = services.api_key_create(tenant=a, name="a-plain")
    b_admin = services.api_key_create(tenant=b, name="b-admin", can_manage=True)
    operator = make_user("op", role="operator")
    user = django_user_model.objects.create_user("someone", password="pw")
    return {"a": a, "b": b, "a_admin": a_admin, "a_plain": a_plain, "b_admin": b_admin, "operator": operator, "user": user}


def as_key(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def endpoints(w) -> list[tuple[str, str, dict]]:
    """Every operation of the API, aimed at tenant B's objects (method, path, body)."""
    b_key = w["b_admin"].key.pk
    return [
        ("get", "/api/v1/tenants/", {}),
        ("post", "/api/v1/tenants/", {"name": "New", "tier": "free"}),
        ("get", "/api/v1/tenants/tenant-b/", {}),
        ("patch", "/api/v1/tenants/tenant-b/", {"name": "Hijacked"}),
        ("post", "/api/v1/tenants/tenant-b/suspend/", {}),
        ("post", "/api/v1/tenants/tenant-b/activate/", {}),
        ("get", "/api/v1/tenants/tenant-b/usage/", {}),
        ("get", "/api/v1/tenants/tenant-b/keys/", {}),
        ("post", "/api/v1/tenants/tenant-b/keys/", {"name": "sneaky"}),
        ("get", f"/api/v1/tenants/tenant-b/keys/{b_key}/", {}),
        ("patch", f"/api/v1/tenants/tenant-b/keys/{b_key}/", {"name": "x"}),
        ("post", f"/api/v1/tenants/tenant-b/keys/{b_key}/rotate/", {}),
        ("post", f"/api/v1/tenants/tenant-b/keys/{b_key}/revoke/", {}),
        ("get", "/api/v1/tiers/", {}),
        ("post", "/api/v1/tiers/", {"name": "gold", "priority": 1}),
        ("get", "/api/v1/tiers/free/", {}),
        ("patch", "/api/v1/tiers/free/", {"priority": 0}),
        # tenant-scoped routes: the tenant comes from the key, B's key id is simply not found
        ("get", "/api/v1/me/", {}),
        ("get", "/api/v1/usage/", {}),
        ("get", "/api/v1/keys/", {}),
        ("post", "/api/v1/keys/", {"name": "mine"}),
        ("get", f"/api/v1/keys/{b_key}/", {}),
        ("patch", f"/api/v1/keys/{b_key}/", {"name": "x"}),
        ("post", f"/api/v1/keys/{b_key}/rotate/", {}),
        ("post", f"/api/v1/keys/{b_key}/revoke/", {}),
    ]


def test_every_route_is_in_the_isolation_matrix(world):
    routes = {str(p.pattern) for p in api_urls.urlpatterns if isinstance(p, URLPattern)}
    covered = set()
    resolver = get_resolver()
    for _, path, _ in endpoints(world):
        covered.add(str(resolver.resolve(path).route).removeprefix("api/v1/"))
    assert routes == covered


def call(client: APIClient, method: str, path: str, body: dict):
    return getattr(client, method)(path, body, format="json") if body else getattr(client, method)(path)


def test_tenant_a_never_reaches_tenant_b(world):
    client = as_key(world["a_admin"].secret)
    b_before = Tenant.objects.get(slug="tenant-b")
    for method, path, body in endpoints(world):
        response = call(client, method, path, body)
        if path.startswith(("/api/v1/tenants/", "/api/v1/tiers/")):
            assert response.status_code == 403, (method, path, response.status_code)
        elif "/keys/" in path and path != "/api/v1/keys/":
            assert response.status_code == 404, (method, path, response.status_code)
        else:  # A's own me/usage/keys: allowed, and only ever about A
            assert response.status_code in (200, 201), (method, path, response.status_code)
            assert "tenant-b" not in response.content.decode()
    b_key = APIKey.objects.get(pk=world["b_admin"].key.pk)
    assert not b_key.revoked and b_key.expires_at is None and b_key.name == "b-admin"
    b_after = Tenant.objects.get(slug="tenant-b")
    assert (b_after.name, b_after.status) == (b_before.name, b_before.status)
    assert not APIKey.objects.filter(tenant__slug="tenant-b", name="sneaky").exists()


@pytest.mark.parametrize("who", ["anonymous", "plain_key", "plain_user"])
def test_without_rights_every_endpoint_is_refused(world, who):
    client = {
        "anonymous": APIClient(),
        "plain_key": as_key(world["a_plain"].secret),
        "plain_user": as_user(world["user"]),
    }[who]
    for method, path, body in endpoints(world):
        response = call(client, method, path, body)
        expected = 401 if who == "anonymous" else 403
        assert response.status_code == expected, (who, method, path, response.status_code)


def test_operators_reach_every_operator_endpoint(world):
    client = as_user(world["operator"])
    for method, path, body in endpoints(world):
        response = call(client, method, path, body)
        if path.startswith(("/api/v1/tenants/", "/api/v1/tiers/")):
            assert response.status_code in (200, 201), (method, path, response.content)
        else:  # operators have no tenant of their own
            assert response.status_code == 403, (method, path)


def test_key_lifecycle_for_a_tenant(world):
    client = as_key(world["a_admin"].secret)
    created = client.post("/api/v1/keys/", {"name": "ci", "allowed_models": ["m"]}, format="json")
    assert created.status_code == 201
    secret = created.json()["api_key"]
    assert secret.startswith("sk-") and created.json()["prefix"] == secret[:11]
    key_id = created.json()["id"]

    listing = client.get("/api/v1/keys/").content.decode()
    assert secret not in listing and "key_hash" not in listing  # shown once, never again
    assert client.get(f"/api/v1/keys/{key_id}/").json()["allowed_models"] == ["m"]

    rotated = client.post(f"/api/v1/keys/{key_id}/rotate/", {"grace_seconds": 60}, format="json").json()
    assert rotated["api_key"] != secret and rotated["rotated_from"] == key_id
    revoked = client.post(f"/api/v1/keys/{key_id}/revoke/").json()
    assert revoked["revoked"] is True


def test_me_and_usage_show_limits(world):
    client = as_key(world["a_admin"].secret)
    me = client.get("/api/v1/me/").json()
    assert me["slug"] == "tenant-a" and me["limits"]["tier"] == world["a"].tier.name
    usage = client.get("/api/v1/usage/").json()
    assert usage["tokens"] == 0 and "period_start" in usage


def test_operator_creates_a_tenant_with_its_first_key_and_tiers(world):
    client = as_user(world["operator"])
    response = client.post("/api/v1/tenants/", {"name": "Globex", "tier": "premium",
                                                "requests_per_minute_override": 5}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["tenant"]["slug"] == "globex" and body["tenant"]["requests_per_minute_override"] == 5
    assert body["api_key"].startswith("sk-")
    assert client.post("/api/v1/tenants/", {"name": "Globex", "tier": "free"}, format="json").status_code == 409
    assert client.post("/api/v1/tenants/globex/suspend/").json()["status"] == "suspended"
    tier = client.post("/api/v1/tiers/", {"name": "gold", "priority": 3, "requests_per_minute": 50}, format="json")
    assert tier.status_code == 201
    assert client.patch("/api/v1/tiers/gold/", {"requests_per_minute": 60}, format="json").json()["requests_per_minute"] == 60
    assert client.get("/api/v1/tiers/nope/").status_code == 404


def test_openapi_schema_and_docs_render(world):
    client = as_user(world["operator"])
    schema = client.get("/api/v1/schema/")
    assert schema.status_code == 200 and b"/api/v1/keys/" in schema.content
    assert client.get("/api/v1/docs/").status_code == 200
