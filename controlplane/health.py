"""Liveness and readiness of a control-plane process (gateway, management API, admin).

`/healthz` answers while the process does (liveness: never depends on anything else, or every pod
would be restarted during a database blink). `/readyz` answers 200 while this process can serve
the API (/v1) and 503 naming what is down otherwise, so a load balancer sends traffic to a gateway
that can serve it:
- Redis, when the limiter or the usage queue uses it: required (limits are refused without it).
- PostgreSQL: `ok`, or, while it does not answer, `degraded` (200) as long as the gateway can serve
  from memory: keys from the last lookups (TESSERA_AUTH_STALE_SECONDS > 0), limits in Redis, and
  usage into a spool with room (controlplane/gateway/usage/spool.py). Taking every gateway out of the load
  balancer during a database blink would turn it into a full outage; the management API and the
  admin answer 503 meanwhile (controlplane/unavailable.py). With the database limiter, or a full
  spool, a database outage is `not_ready`.
"""

from __future__ import annotations

import os

import redis
from django.conf import settings
from django.db import DatabaseError, connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from controlplane.gateway.usage.spool import directory_state


def database_ok(alias: str = "default") -> bool:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError:
        connections[alias].close()  # reconnect on the next check instead of reusing a broken socket
        return False


def redis_needed() -> bool:
    return bool(settings.REDIS_URL) and (settings.TESSERA_LIMITER == "redis" or settings.TESSERA_USAGE_QUEUE == "redis")


def redis_ok() -> bool:
    timeout = settings.TESSERA_REDIS_TIMEOUT_SECONDS
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def spool_state() -> str:
    """`ok` when this process's usage spool can take usage, else why not."""
    directory = settings.TESSERA_USAGE_SPOOL_DIR
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "unwritable"
    if not os.access(directory, os.W_OK):
        return "unwritable"
    if directory_state(directory)["bytes"] >= settings.TESSERA_USAGE_SPOOL_MAX_BYTES:
        return "full"
    return "ok"


def serves_without_database() -> bool:
    return settings.TESSERA_AUTH_STALE_SECONDS > 0 and settings.TESSERA_LIMITER == "redis"


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": "ok" if database_ok() else "unreachable"}
    if redis_needed():
        checks["redis"] = "ok" if redis_ok() else "unreachable"
    status = "ready" if all(value == "ok" for value in checks.values()) else "not_ready"
    if checks["database"] != "ok" and checks.get("redis", "ok") == "ok" and serves_without_database():
        checks["spool"] = spool_state()
        if checks["spool"] == "ok":
            status = "degraded"  # serving /v1 from memory, usage spooled: keep sending traffic
    response = JsonResponse({"status": status, "checks": checks}, status=503 if status == "not_ready" else 200)
    if status == "not_ready":
        response["Retry-After"] = "2"
    return response
