"""A dependency that cannot be reached is the platform being briefly unavailable, not a bug.

While PostgreSQL (keys, the database limiter, the usage journal) or Redis (the Redis limiter)
does not answer, the gateway refuses with 503 `service_unavailable`, `Retry-After` and an OpenAI
error body, never a 500 `internal_error`: clients and SDKs retry a 503 with backoff, and the
operator's logs say which dependency is down instead of a traceback per request.
"""

from __future__ import annotations

import logging

import redis.exceptions
from django.db import InterfaceError, OperationalError

from controlplane.errors import ApplicationError

log = logging.getLogger("tessera.gateway")

RETRY_AFTER_SECONDS = 2
_KINDS: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((OperationalError, InterfaceError), "database"),
    ((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError), "redis"),
)


def dependency_of(exc: BaseException) -> str | None:
    """'database' or 'redis' when `exc` (or what caused it) is that dependency being unreachable."""
    seen = 0
    while exc is not None and seen < 8:
        for types, name in _KINDS:
            if isinstance(exc, types):
                return name
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def unavailable(exc: BaseException, request_id: str) -> ApplicationError | None:
    """The 503 for a dependency outage, or None when `exc` is something else (a bug: a 500)."""
    dependency = dependency_of(exc)
    if dependency is None:
        return None
    log.warning("dependency unavailable; answering 503", extra={"request_id": request_id, "dependency": dependency,
                                                                 "error": repr(exc)[:300]})
    return ApplicationError(
        "The platform is temporarily unavailable. Please retry shortly.", code="service_unavailable",
        status=503, type="server_error", headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
