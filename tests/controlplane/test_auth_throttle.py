"""Failed API-key authentications throttled per client address, through the deployed ASGI app on a real
socket (uvicorn): /v1 (OpenAI's error body) and /api/v1 (DRF's), both limiter backends, X-Forwarded-For
honoured only behind trusted proxy hops. Client addresses are real: each client binds its own loopback
source address (127.0.0.N)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tenants import auth_throttle
from tenants.limits import auth_failures

from .asgi_driver import call, chat_body

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 20


@pytest.fixture(params=["database", pytest.param("redis", marks=pytest.mark.redis)])
def throttled(request, gateway):
    """The gateway's settings with the throttle on (LIMIT a minute) on the given limiter backend."""
    if request.param == "redis":
        request.getfixturevalue("use_redis_limiter")
    gateway.TESSERA_AUTH_FAILURES_PER_MINUTE = LIMIT
    auth_failures.reset_store()
    auth_throttle.clear()
    yield gateway
    auth_failures.reset_store()
    auth_throttle.clear()


@pytest.fixture
def server(throttled, live_gateway):
    return live_gateway


def client_at(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def made_up() -> str:
    return "sk-" + uuid.uuid4().hex + uuid.uuid4().hex


def bearer(secret: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **headers}


def models(client: httpx.Client, base: str, secret: str, **headers: str) -> httpx.Response:
    return client.get(f"{base}/v1/models", headers=bearer(secret, **headers))


def failures(door: str, outcome: str) -> float:
    from controlplane.slo.metrics import REGISTRY

    return REGISTRY.get_sample_value("tessera_auth_key_failures_total", {"door": door, "outcome": outcome}) or 0.0


def assert_throttled_openai(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "too_many_failed_auth" and error["type"] == "requests"
    assert 1 <= int(response.headers["retry-after"]) <= 3  # one more failure allowed every 60/LIMIT s
    assert int(response.headers["retry-after-ms"]) > 0
    assert response.headers["x-request-id"].startswith("req_")


def test_the_21st_failure_is_a_429_and_another_address_is_unaffected(server, tenant_key):
    _, good = tenant_key.sync()
    attacker, other = client_at("127.0.0.2"), client_at("127.0.0.3")
    counted, refused = failures("v1", "counted"), failures("v1", "refused")
    statuses = [models(attacker, server, made_up()).status_code for _ in range(LIMIT)]
    assert statuses == [401] * LIMIT
    assert_throttled_openai(models(attacker, server, made_up()))
    assert_throttled_openai(models(attacker, server, "not-even-a-key"))  # no lookup, no count: still refused
    assert models(other, server, made_up()).status_code == 401
    assert models(other, server, good).status_code == 200
    assert (failures("v1", "counted") - counted, failures("v1", "refused") - refused) == (LIMIT + 1, 2)


def test_a_key_already_used_from_the_address_keeps_working_and_a_new_one_waits(server, tenant_key):
    """Behind one NAT: a client that already authenticated from there is served through its neighbour's
    flood; a key the address never showed waits out the Retry-After (so a guess learns nothing)."""
    _, known = tenant_key.sync()
    _, fresh = tenant_key.sync()
    nat = client_at("127.0.0.4")
    assert models(nat, server, known).status_code == 200
    for _ in range(LIMIT + 5):
        models(nat, server, made_up())
    assert models(nat, server, known).status_code == 200
    assert_throttled_openai(models(nat, server, fresh))


def test_a_revoked_key_that_was_known_counts_as_a_failure(server, tenant_key):
    from tenants import services
    from tenants.models import APIKey

    tenant, known = tenant_key.sync()
    nat = client_at("127.0.0.5")
    assert models(nat, server, known).status_code == 200
    for _ in range(LIMIT + 1):
        models(nat, server, made_up())
    services.api_key_revoke(tenant=tenant, key=APIKey.objects.get(tenant=tenant))
    assert_throttled_openai(models(nat, server, known))


def test_large_bodies_are_refused_before_they_are_read(throttled, tenant_key):
    """The handler's check before the body: a refused address's megabyte is never read."""
    import asyncio

    from controlplane.asgi import application

    async def post(secret):
        return await call(application, "/v1/chat/completions", [chat_body(256 * 1024)],
                          headers=bearer(secret))

    async def run():
        replies = [await post(made_up()) for _ in range(LIMIT + 1)]
        return replies

    replies = asyncio.run(run())
    assert [r.status for r in replies] == [401] * LIMIT + [429]
    assert replies[-1].receive_calls == 0 and replies[-1].json()["error"]["code"] == "too_many_failed_auth"


def test_the_management_api_throttles_failed_keys_in_drf_format(server, tenant_key):
    _, admin = tenant_key.sync(key_fields={"can_manage": True})
    attacker, other = client_at("127.0.0.6"), client_at("127.0.0.7")
    me = f"{server}/api/v1/me/"
    assert [attacker.get(me, headers=bearer(made_up())).status_code for _ in range(LIMIT)] == [401] * LIMIT
    before = failures("api", "refused")
    refused = attacker.get(me, headers=bearer(made_up()))
    assert refused.status_code == 429 and failures("api", "refused") == before + 1
    assert refused.json()["code"] == "too_many_failed_auth" and "detail" in refused.json()
    assert 1 <= int(refused.headers["retry-after"]) <= 3
    assert other.get(me, headers=bearer(made_up())).status_code == 401
    assert other.get(me, headers=bearer(admin)).status_code == 200


def test_both_doors_share_one_count(server):
    attacker = client_at("127.0.0.8")
    me = f"{server}/api/v1/me/"
    assert [models(attacker, server, made_up()).status_code for _ in range(LIMIT // 2)] == [401] * (LIMIT // 2)
    assert [attacker.get(me, headers=bearer(made_up())).status_code for _ in range(LIMIT // 2)] == [401] * (LIMIT // 2)
    assert attacker.get(me, headers=bearer(made_up())).status_code == 429
    assert_throttled_openai(models(attacker, server, made_up()))


def test_behind_a_trusted_proxy_the_forwarded_client_is_counted(server, throttled):
    throttled.TESSERA_TRUSTED_PROXY_HOPS = 1
    proxy = client_at("127.0.0.9")  # every request comes from the proxy's socket
    for _ in range(LIMIT):
        assert models(proxy, server, made_up(), **{"X-Forwarded-For": "203.0.113.7"}).status_code == 401
    assert_throttled_openai(models(proxy, server, made_up(), **{"X-Forwarded-For": "203.0.113.7"}))
    # The client prepends addresses of its choosing: the proxy's own entry (rightmost) still decides.
    spoofed = {"X-Forwarded-For": "198.51.100.1, 203.0.113.7"}
    assert_throttled_openai(models(proxy, server, made_up(), **spoofed))
    assert models(proxy, server, made_up(), **{"X-Forwarded-For": "203.0.113.8"}).status_code == 401


def test_without_trusted_hops_a_forged_forwarded_for_changes_nothing(server, throttled):
    throttled.TESSERA_TRUSTED_PROXY_HOPS = 0
    attacker = client_at("127.0.0.10")
    for i in range(LIMIT):
        forged = {"X-Forwarded-For": f"203.0.113.{i + 1}"}
        assert models(attacker, server, made_up(), **forged).status_code == 401
    assert_throttled_openai(models(attacker, server, made_up(), **{"X-Forwarded-For": "203.0.113.99"}))


@pytest.mark.redis
def test_redis_unreachable_the_throttle_fails_open(server, throttled, tenant_key):
    """The counter's store gone: bad keys stay 401 (never 429, never 5xx) and good keys are served."""
    _, good = tenant_key.sync()
    throttled.TESSERA_LIMITER, throttled.REDIS_URL = "redis", "redis://127.0.0.1:9/0"  # nothing listens on 9
    auth_failures.reset_store()
    attacker = client_at("127.0.0.11")
    uncounted = failures("v1", "uncounted")
    assert [models(attacker, server, made_up()).status_code for _ in range(LIMIT + 5)] == [401] * (LIMIT + 5)
    assert failures("v1", "uncounted") == uncounted + LIMIT + 5
    assert models(attacker, server, good).status_code == 200
