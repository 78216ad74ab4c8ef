"""A dependency that cannot be reached is the platform being briefly unavailable, not a bug.

What still works from memory while PostgreSQL is away (docs/reliability.md): keys looked up within
TESSERA_AUTH_STALE_SECONDS (tenants/auth.py), routing (the last routing table), cached prices, and
usage, which goes to the local spool (spool.py). What needs the database is refused as below.

While PostgreSQL (keys, the database limiter, the usage journal) or Redis (the Redis limiter)
does not answer, the gateway refuses with 503 `service_unavailable`, `Retry-After` and an OpenAI
error body, never a 500 `internal_error`: clients and SDKs retry a 503 with backoff, and the
operator's logs say which dependency is down instead of a traceback per request.
"""

from __future__ import annotations

import logging
import time

from common.errors import ApplicationError
from controlplane.gateway.dependencies import dependency_of
from controlplane.gateway.usage import spool_metrics

log = logging.getLogger("tessera.gateway")

RETRY_AFTER_SECONDS = 2


_down_until: dict[str, float] = {}
DOWN_FOR = 1.0  # seconds a failed dependency is skipped where memory can answer instead


def mark_down(dependency: str) -> None:
    _down_until[dependency] = time.monotonic() + DOWN_FOR


def recently_down(dependency: str) -> bool:
    """Whether `dependency` failed within the last DOWN_FOR seconds (callers with a memory fallback
    use it first, and try the dependency again once a second)."""
    return _down_until.get(dependency, 0.0) > time.monotonic()


_noted: dict[str, float] = {}
NOTE_EVERY = 30.0  # seconds between log lines per kind: an outage must not flood the log


def note_serving_from_memory(what: str) -> None:
    """Log (at most every NOTE_EVERY seconds per kind) that the database is away and `what` is served
    from memory; counted in tessera_gateway_served_from_memory_total."""
    spool_metrics.SERVED_FROM_MEMORY.labels(what).inc()
    now = time.monotonic()
    if now - _noted.get(what, -NOTE_EVERY) >= NOTE_EVERY:
        _noted[what] = now
        log.warning("database unavailable; serving %s from memory", what)


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
