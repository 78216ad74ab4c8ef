"""Liveness and readiness of a control-plane process (gateway, management API, admin).

`/healthz` answers while the process does (liveness: never depends on anything else, or every pod
would be restarted during a database blink). `/readyz` answers 200 only while the dependencies a
request needs answer — PostgreSQL always (keys, the usage journal, the database limiter), Redis
when the limiter or the usage queue uses it — and 503 naming what is down otherwise, so a load
balancer sends traffic to a gateway that can serve it (and every gateway answers 503s meanwhile).
"""

from __future__ import annotations

from django.conf import settings
from django.db import DatabaseError, connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


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
    import redis

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


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": "ok" if database_ok() else "unreachable"}
    if redis_needed():
        checks["redis"] = "ok" if redis_ok() else "unreachable"
    ready = all(value == "ok" for value in checks.values())
    response = JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks}, status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = "2"
    return response
