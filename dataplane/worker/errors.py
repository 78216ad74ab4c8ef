"""One error type for the worker, rendered as OpenAI's error body.

`{"error": {"message", "type", "param", "code"}}` with the HTTP status the official client maps
to its exception classes (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError,
429 RateLimitError, 500 InternalServerError, 503 ...). Engine ValueErrors start with the
offending field's name ("max_tokens: must be ..."), which becomes `param`.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response

_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          429: "rate_limit_exceeded", 503: "server_error", 500: "server_error"}


class WorkerError(Exception):
    def __init__(self, message: str, *, status: int = 400, code: str | None = None, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> Response:
        return Response(orjson.dumps(self.body()), status_code=self.status, media_type="application/json",
                        headers={**self.headers, **(headers or {})})

    def sse_event(self) -> bytes:
        """The in-band form, for a failure after a stream's headers went out."""
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> WorkerError:
    return WorkerError(message, status=400, code=code, param=param)


def context_length_exceeded(max_model_len: int, prompt_tokens: int, max_tokens: int, param: str) -> WorkerError:
    return WorkerError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {param}, {max_tokens} in the completion). "
        f"Please reduce the length of the {param} or completion.",
        status=400, code="context_length_exceeded", param=param)


def from_value_error(exc: ValueError, prompt_param: str) -> WorkerError:
    """Map an engine ValueError ("field: reason") to a 400 naming the field."""
    text = str(exc)
    field, sep, _ = text.partition(":")
    param = field.strip() if sep and field.strip().isidentifier() else None
    if param == "prompt":
        param = prompt_param
        if "context length" in text or "KV blocks" in text:
            return WorkerError(text, status=400, code="context_length_exceeded", param=param)
    return invalid(text, param)


def from_validation_error(exc: ValidationError) -> WorkerError:
    """The first pydantic error as a 400: bad JSON, a body that is not an object, or a field's type."""
    err = exc.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return invalid("We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                       "using your HTTP library correctly.)", None, "invalid_json")
    loc = err["loc"]
    if not loc:
        return invalid("The request body must be a JSON object.", None, "invalid_json")
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part not in _UNION_TAGS and "[" not in part and "-" not in part:  # union members: "list[str]"
            param += ("." if param else "") + part
    code = "missing_required_parameter" if err["type"] == "missing" else (
        "invalid_type" if err["type"].endswith("_type") or err["type"] == "model_attributes_type" else "invalid_value")
    return invalid(f"{param}: {err['msg']}", param or None, code)


def queue_full(message: str, retry_after: int) -> WorkerError:
    return WorkerError(f"The worker is at capacity ({message}). Please retry shortly.", status=429,
                       code="queue_full", headers={"Retry-After": str(retry_after)})


def unavailable(message: str, retry_after: int, code: str) -> WorkerError:
    return WorkerError(message, status=503, code=code, headers={"Retry-After": str(retry_after)})


def internal(message: str) -> WorkerError:
    return WorkerError(message, status=500, code="internal_error")
