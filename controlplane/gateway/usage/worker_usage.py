"""Asking a worker for a request's own token counts (the worker's usage route).

The worker is the only source of truth for billing: it tokenized the prompt and generated the
tokens. The gateway asks after a request ended without a final usage object (the client left, the
stream broke, a timeout), and the sweeper asks for requests whose gateway died. `wait` lets the
worker finish aborting the request first, so the answer counts every token it generated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from controlplane.gateway import upstream

log = logging.getLogger("tessera.gateway")

ROUTE = "/tessera/v1/requests/{request_id}/usage"


@dataclass(frozen=True, slots=True)
class WorkerCounts:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    state: str  # "running" | "finished" | "unknown" (the worker has no record of it)
    counts: WorkerCounts | None


def counts_from(data: dict) -> WorkerCounts:
    """From the worker's JSON (usage route or accounting frame); ValueError on a malformed one."""
    try:
        prompt, cached, completion = (int(data[k]) for k in ("prompt_tokens", "cached_tokens", "completion_tokens"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed worker counts: {data!r}") from exc
    if min(prompt, cached, completion) < 0 or cached > prompt:
        raise ValueError(f"impossible worker counts: {data!r}")
    return WorkerCounts(prompt, cached, completion)


async def ask(worker_url: str, request_id: str, *, wait: float = 0.0, timeout: float = 5.0) -> WorkerAnswer | None:
    """The worker's answer, or None when it could not be asked (unreachable, an error, a bad body)."""
    url = worker_url.rstrip("/") + ROUTE.format(request_id=quote(request_id, safe=""))
    try:
        response = await upstream.client().get(
            url, params={"wait": f"{wait:g}"} if wait else None, headers=upstream.worker_auth_headers(),
            timeout=timeout + wait,
        )
    except httpx.HTTPError as exc:
        log.warning("worker usage query failed", extra={"request_id": request_id, "worker": worker_url, "error": repr(exc)})
        return None
    if response.status_code == 404:
        return WorkerAnswer("unknown", None)
    if response.status_code != 200:
        log.warning("worker usage query refused", extra={"request_id": request_id, "worker": worker_url,
                                                          "status": response.status_code})
        return None
    try:
        data = response.json()
        state = data.get("state")
        if state not in ("running", "finished"):
            raise ValueError(f"unknown state {state!r}")
        return WorkerAnswer(state, counts_from(data))
    except ValueError as exc:
        log.warning("worker usage answer malformed", extra={"request_id": request_id, "error": str(exc)})
        return None
