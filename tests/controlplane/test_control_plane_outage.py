"""The management API and the admin while PostgreSQL does not answer: 503 + Retry-After, never a 500."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def away(database_switch):
    return database_switch.away


@pytest.fixture
def database_away(away):
    away()


def test_the_management_api_answers_503_with_retry_after(client, database_away):
    response = client.get("/api/v1/tenants/", HTTP_AUTHORIZATION="Bearer sk-" + "a" * 40)
    assert response.status_code == 503, response.content[:500]
    assert response["Retry-After"] == "2"
    assert response.json() == {"detail": "The platform is temporarily unavailable. Please retry shortly.",
                               "code": "service_unavailable"}


def test_the_admin_answers_503_with_retry_after(client, away, django_user_model):
    operator = django_user_model.objects.create_superuser("outage-op", "op@example.com", "pw-1234567")
    client.force_login(operator)
    away()
    for response in (client.get("/admin/"), client.get("/admin/tenants/tenant/"),
                     client.post("/admin/login/", {"username": "outage-op", "password": "pw-1234567"})):
        assert response.status_code == 503, (response.status_code, response.content[:300])
        assert response["Retry-After"] == "2" and b"temporarily unavailable" in response.content


def test_readiness_says_not_ready_and_liveness_stays_up(client, database_away):
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["database"] == "unreachable"
    assert client.get("/healthz").status_code == 200


@pytest.mark.redis
def test_readiness_is_degraded_not_down_while_the_gateway_can_serve_from_memory(client, away, settings, redis_url,
                                                                                   tmp_path):
    """With the Redis limiter and keys from memory, a gateway serves /v1 through a database blink: its pod
    stays in the load balancer (200 `degraded`) while its spool has room, and leaves it when full."""
    settings.REDIS_URL, settings.TESSERA_LIMITER, settings.TESSERA_AUTH_STALE_SECONDS = redis_url, "redis", 300
    settings.TESSERA_USAGE_SPOOL_DIR = tmp_path / "spool"
    away()
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.content
    assert ready.json() == {"status": "degraded", "checks": {"database": "unreachable", "redis": "ok", "spool": "ok"}}
    (tmp_path / "spool" / "usage-h-1-ab.spool").write_bytes(b"x" * 100)
    settings.TESSERA_USAGE_SPOOL_MAX_BYTES = 100
    full = client.get("/readyz")
    assert full.status_code == 503 and full.json()["checks"]["spool"] == "full"
    settings.TESSERA_AUTH_STALE_SECONDS = 0  # no serving from memory: a database outage is an outage
    assert client.get("/readyz").json()["status"] == "not_ready"


def test_the_workers_internal_api_answers_503_so_heartbeats_are_retried(client, database_away, settings):
    settings.TESSERA_INTERNAL_TOKEN = "internal-secret"
    response = client.post("/internal/v1/workers/w-1/heartbeat", data={"status": "ready"},
                           content_type="application/json", HTTP_AUTHORIZATION="Bearer internal-secret",
                           REMOTE_ADDR="10.0.0.5")
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == "2" and response.json()["code"] == "service_unavailable"
