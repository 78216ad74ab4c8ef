"""Prompt and completion text in the logs: never, unless an operator turns on sampling for a tenant.

`Tenant.log_content_sample_rate` (admin, "Observability") is the fraction of that tenant's requests
whose request body and completion text the gateway logs, on the `tessera.gateway.content` logger,
with the request id (so the line joins the gateway's and the worker's other lines). The default, 0,
logs no text at all; every other log line carries ids, counts and timings only.
"""

from __future__ import annotations

import logging
import random

from tenants.auth import KeyPrincipal

log = logging.getLogger("tessera.gateway.content")
MAX_CHARS = 32_000  # a sampled line stays a line


def sampled(principal: KeyPrincipal) -> bool:
    rate = principal.log_content_sample_rate
    return rate > 0 and (rate >= 1 or random.random() < rate)


def request(principal: KeyPrincipal, request_id: str, body: bytes) -> bool:
    """Log the request body when this request is sampled; return whether it was."""
    if not sampled(principal):
        return False
    log.info("request content", extra={"request_id": request_id, "tenant": principal.tenant_slug,
                                       "body": body[:MAX_CHARS].decode("utf-8", "replace")})
    return True


def completion(principal: KeyPrincipal, request_id: str, text: bytes | str) -> None:
    if isinstance(text, bytes):
        text = text[:MAX_CHARS].decode("utf-8", "replace")
    log.info("completion content", extra={"request_id": request_id, "tenant": principal.tenant_slug,
                                          "completion": text[:MAX_CHARS]})
