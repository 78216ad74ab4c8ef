"""The management API's rendering of errors (DRF's `EXCEPTION_HANDLER`).

Kept out of common/errors.py: the error type sits below every app, while this handler
knows about outages (a dependency down answers 503) and so depends on the gateway's outage map.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DataError
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler
from rest_framework.views import set_rollback

from common.errors import ApplicationError
from controlplane import unavailable
from controlplane.gateway.outages import RETRY_AFTER_SECONDS, dependency_of

log = logging.getLogger("tessera.api")


def drf_exception_handler(exc: Exception, context: dict[str, Any]):
    if isinstance(exc, ApplicationError):
        data: dict[str, Any] = {"detail": exc.message, "code": exc.code}
        if exc.param:
            data["param"] = exc.param
        return Response(data, status=exc.status, headers=exc.headers)
    if isinstance(exc, DataError):
        # The database refused a value the client sent (a NUL byte in a query parameter or a slug
        # lookup, a number out of range): the client's error, not a 500 that burns the SLO.
        log.warning("database refused a request's value: %s", exc, extra={"path": getattr(context.get("request"), "path", None)})
        set_rollback()
        return Response({"detail": "A value in the request is not acceptable (out of range or an invalid character).",
                         "code": "invalid_value"}, status=400)
    if (dependency := dependency_of(exc)) is not None:  # PostgreSQL or Redis unreachable: a 503, not a 500
        unavailable.note(dependency, getattr(context.get("request"), "path", ""))
        set_rollback()
        return Response(unavailable.api_body(), status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        # DRF answers 403 when no authenticator sends WWW-Authenticate; say 401 like the gateway does.
        response = drf_default_handler(exc, context)
        if response is not None:
            response.status_code = 401
        return response
    return drf_default_handler(exc, context)
