"""The one application error type, and its two renderings.

Services raise `ApplicationError`; the gateway renders it as OpenAI's error body
(`{"error": {"message", "type", "param", "code"}}`) and the management API as DRF's
(`{"detail": ..., "code": ...}`), both with the same status code and headers.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DataError

log = logging.getLogger("tessera.api")

# The OpenAI error `type` that goes with each status code.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_exceeded",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


class ApplicationError(Exception):
    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 400,
        type: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.type = type or _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.headers = dict(headers or {})

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class NotFound(ApplicationError):
    def __init__(self, message: str = "Not found.") -> None:
        super().__init__(message, code="not_found", status=404)


class PermissionDenied(ApplicationError):
    def __init__(self, message: str = "You do not have permission to perform this action.") -> None:
        super().__init__(message, code="permission_denied", status=403)


def drf_exception_handler(exc: Exception, context: dict[str, Any]):
    # DRF is imported here, not at module level: the gateway imports this module and never needs DRF.
    from rest_framework import exceptions as drf_exceptions
    from rest_framework.response import Response
    from rest_framework.views import exception_handler as drf_default_handler
    from rest_framework.views import set_rollback

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
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        # DRF answers 403 when no authenticator sends WWW-Authenticate; say 401 like the gateway does.
        response = drf_default_handler(exc, context)
        if response is not None:
            response.status_code = 401
        return response
    return drf_default_handler(exc, context)
