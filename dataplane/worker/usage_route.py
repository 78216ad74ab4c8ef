"""`GET /tessera/v1/requests/{request_id}/usage`: a request's own token counts, for the gateway.

The gateway asks after a stream ended without a usage object (its client left, the stream broke)
and its sweeper asks for requests whose gateway died. `?wait=S` (at most 10 s) waits for a running
request to finish first: right after the gateway drops the connection the worker is still aborting
the engine request, and the answer must be the final figure, not a stale "running".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dataplane.worker import errors
from dataplane.worker.usage_memory import UsageMemory

ROUTE = "/tessera/v1/requests/{request_id:path}/usage"  # :path: an id may hold a "/" (sent as %2F)
MAX_WAIT = 10.0  # seconds; a caller holding a connection longer gains nothing a retry would not


def routes(usage: UsageMemory, authorize: Callable[[Request], None]) -> list[Route]:
    async def request_usage(request: Request) -> Response:
        try:
            authorize(request)
            wait = _wait(request.query_params.get("wait"))
        except errors.WorkerError as exc:
            return exc.response()
        request_id = request.path_params["request_id"]
        entry = await usage.wait(request_id, wait)
        if entry is None:
            return errors.WorkerError(f"No request {request_id!r} is known to this worker (never started here, "
                                      "or forgotten).", status=404, code="request_not_found").response()
        return Response(orjson.dumps(entry.as_json()), media_type="application/json")

    return [Route(ROUTE, request_usage, methods=["GET"])]


def _wait(raw: str | None) -> float:
    if raw is None or raw == "":
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        raise errors.invalid(f"wait: must be a number of seconds >= 0, got {raw!r}", "wait")
    return min(seconds, MAX_WAIT)
