"""OpenAI-shaped responses: error bodies and the x-ratelimit-* headers."""

from __future__ import annotations

import math

import orjson
from django.http import HttpResponse

from common.errors import ApplicationError
from tenants.limits import Decision

JSON = "application/json"


def duration(seconds: float) -> str:
    """OpenAI's reset format (Go durations): 20ms, 1s, 1.5s, 6m0s, 1h2m3s."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    secs_text = f"{secs:.3f}".rstrip("0").rstrip(".")
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{secs_text}s"
    if minutes >= 1:
        return f"{int(minutes)}m{secs_text}s"
    return f"{secs_text}s"


def ratelimit_headers(decision: Decision | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if decision is None:
        return headers
    for name, window in (("requests", decision.requests), ("tokens", decision.tokens)):
        if window is not None:
            headers[f"x-ratelimit-limit-{name}"] = str(window.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(window.remaining)
            headers[f"x-ratelimit-reset-{name}"] = duration(window.reset_seconds)
    if decision.over_soft_budget:
        headers["x-tessera-budget"] = "exceeded-soft"
    return headers


def refusal(decision: Decision, tenant_slug: str, requested_tokens: int) -> ApplicationError:
    """The 429 for a refused reservation, worded like OpenAI's."""
    retry = max(decision.retry_after, 0.001)
    headers = ratelimit_headers(decision)
    headers.update({"Retry-After": str(max(1, math.ceil(retry))), "retry-after-ms": str(math.ceil(retry * 1000))})
    wait = f"Please try again in {duration(retry)}."
    reason = decision.reason
    if reason in ("token_budget", "spend_budget"):
        what = "monthly token budget" if reason == "token_budget" else "monthly spend budget"
        return ApplicationError(
            f"You exceeded your current quota ({what} of tenant {tenant_slug}). It resets at the start of next month.",
            code="insufficient_quota", status=429, type="insufficient_quota", headers=headers,
        )
    if reason == "requests":
        w = decision.requests
        message = f"Rate limit reached for requests per min (RPM) on tenant {tenant_slug}: Limit {w.limit}, Used {w.limit - w.remaining}, Requested 1. {wait}"
    elif reason in ("tokens", "too_large"):
        w = decision.tokens
        if reason == "too_large":
            message = f"Request too large for tokens per min (TPM) on tenant {tenant_slug}: Limit {w.limit}, Requested {requested_tokens}. Lower max_tokens or the prompt."
        else:
            message = f"Rate limit reached for tokens per min (TPM) on tenant {tenant_slug}: Limit {w.limit}, Used {w.limit - w.remaining}, Requested {requested_tokens}. {wait}"
    else:
        message = f"Too many concurrent requests on tenant {tenant_slug}. {wait}"
    kind = "tokens" if reason in ("tokens", "too_large") else "requests"
    return ApplicationError(message, code="rate_limit_exceeded", status=429, type=kind, headers=headers)


def error_response(exc: ApplicationError, request_id: str, headers: dict[str, str] | None = None) -> HttpResponse:
    response = HttpResponse(orjson.dumps(exc.openai_body()), status=exc.status, content_type=JSON)
    for name, value in (headers or {}).items():
        response[name] = value
    for name, value in exc.headers.items():
        response[name] = value
    response["x-request-id"] = request_id
    return response


def json_response(payload, *, request_id: str, status: int = 200) -> HttpResponse:
    response = HttpResponse(orjson.dumps(payload), status=status, content_type=JSON)
    response["x-request-id"] = request_id
    return response
