"""The management API and the admin while PostgreSQL (or Redis) does not answer: a 503, not a 500.

The gateway has its own path (controlplane/gateway/outages.py: it serves from memory what it can).
Everything else the control plane serves needs the database; while it is unreachable, clients get
503 with `Retry-After` (DRF's shape on /api/v1/, a short page elsewhere) and the log one warning per
NOTE_EVERY seconds instead of a traceback per request.
"""

from __future__ import annotations

import logging
import time

from django.http import HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

from controlplane.gateway.outages import RETRY_AFTER_SECONDS, dependency_of

log = logging.getLogger("tessera.controlplane")

NOTE_EVERY = 30.0
MESSAGE = "The platform is temporarily unavailable. Please retry shortly."
_noted: dict[str, float] = {}


def note(dependency: str, path: str) -> None:
    now = time.monotonic()
    if now - _noted.get(dependency, -NOTE_EVERY) >= NOTE_EVERY:
        _noted[dependency] = now
        log.warning("%s unavailable; answering 503", dependency, extra={"path": path})


def api_body() -> dict:
    return {"detail": MESSAGE, "code": "service_unavailable"}


class DependencyUnavailableMiddleware(MiddlewareMixin):
    """Turns an unreachable database or Redis, raised by a view, into a 503 (the admin, health, exports).
    Sync and async (MiddlewareMixin): a sync-only middleware would run every async view in one thread."""

    def process_exception(self, request, exc):
        dependency = dependency_of(exc)
        if dependency is None:
            return None
        note(dependency, request.path)
        if request.path.startswith("/api/"):
            response = JsonResponse(api_body(), status=503)
        else:
            response = HttpResponse(f"<!doctype html><title>Temporarily unavailable</title><h1>{MESSAGE}</h1>",
                                    status=503, content_type="text/html; charset=utf-8")
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
