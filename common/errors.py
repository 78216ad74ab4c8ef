"""The one application error type, and its two renderings.

Services raise `ApplicationError`; the gateway renders it as OpenAI's error body
(`{"error": {"message", "type", "param", "code"}}`) and the management API as DRF's
(`{"detail": ..., "code": ...}`, controlplane/api_errors.py), both with the same status code and headers.
"""

from __future__ import annotations

from typing import Any

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
