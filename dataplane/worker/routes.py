"""The worker's HTTP surface (Starlette): OpenAI routes, health, readiness, metrics.

The model loads in a background thread after the server binds, so `/health` answers while a
large model loads and `/ready` turns 200 only once it can serve. Non-health routes require the
worker token when one is configured. Every response echoes `X-Request-Id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dataplane.scheduler.fairness import MAX_WEIGHT
from dataplane.worker import adapters, disaggregation, embeddings, errors, usage_route
from dataplane.worker.drain import Draining
from dataplane.worker.generation import RequestContext
from dataplane.worker.state import WorkerState
from dataplane.worker.streaming import ClientGone, EventStream

log = logging.getLogger("tessera.worker")


def _json(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _kv_cache_dtype(engine: object) -> str | None:
    """What the engine's KV cache holds ("fp8", "bfloat16", ...) for /v1/models; None while nothing serves."""
    memory = getattr(getattr(engine, "core", None), "memory", None)
    return getattr(memory, "kv_cache_dtype", None)


def _request_id(request: Request) -> str:
    rid = request.headers.get("x-request-id", "").strip()
    if rid and len(rid) <= 128 and rid.isascii() and rid.isprintable():
        return rid
    return uuid.uuid4().hex


def create_app(state: WorkerState) -> Starlette:
    config = state.config

    def authorize(request: Request) -> None:
        if not config.token:
            return
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(secret.strip().encode(), config.token.encode()):
            raise errors.WorkerError("Missing or invalid worker token.", status=401, code="invalid_api_key")

    async def generate(request: Request, kind: str) -> Response:
        started = time.monotonic()
        rid = _request_id(request)
        headers = {"X-Request-Id": rid}
        ticket = None
        response: Response | None = None
        try:
            authorize(request)
            serving = state.serving
            if serving is None or state.status() == "dead":
                raise errors.unavailable(f"The model is {state.status()}; retry shortly.", config.retry_after,
                                         "model_" + state.status())
            ticket = state.drainer.admit()
            raw = await request.body()
            allowance = _allowance(request)
            if kind == "embeddings":
                job = embeddings.prepare(serving, raw, allowance)
            else:
                job = serving.prepare_chat(raw, allowance) if kind == "chat" else serving.prepare_completion(raw, allowance)
            ctx = RequestContext(rid, request.headers.get("x-tenant-id"), _header_int(request, "x-priority"),
                                 request.headers.get("x-cache-salt") or None, request.receive, started,
                                 accounting=request.headers.get("x-tessera-accounting") == "1",
                                 tenant_weight=_tenant_weight(request),
                                 prefill_url=request.headers.get("x-tessera-prefill-url") or None)
            response = await (embeddings.run(serving, job, ctx) if kind == "embeddings" else serving.run(job, ctx))
        except Draining:
            response = errors.unavailable("This worker is draining; send the request elsewhere.",
                                          config.retry_after, "draining").response()
            state.metrics.reject("draining")
        except errors.WorkerError as exc:
            response = exc.response()
            if exc.status != 500:
                state.metrics.reject(exc.code or str(exc.status))
        except ClientGone:
            response = Response(status_code=499)  # nobody reads it; the engine request is already aborted
        except Exception:
            log.exception("unhandled error", extra={"request_id": rid})
            response = errors.internal("The worker failed on this request.").response()
        finally:
            if ticket is not None:
                if isinstance(response, EventStream):
                    response.on_close = lambda gone, t=ticket: t.release()
                else:
                    ticket.release()
        response.headers.update(headers)
        return response

    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await generate(request, "completions")

    async def embed(request: Request) -> Response:
        return await generate(request, "embeddings")

    async def models(request: Request) -> Response:
        try:
            authorize(request)
        except errors.WorkerError as exc:
            return exc.response()
        card = {"id": config.model_id, "object": "model", "created": state.created, "owned_by": "tessera",
                "root": config.model, "parent": None,
                "max_model_len": state.engine.max_model_len if state.engine else None,
                "kv_cache_dtype": _kv_cache_dtype(state.engine),
                "tool_call_parser": state.serving.tool_parser_name if state.serving else None}
        return _json({"object": "list", "data": [card, *adapters.model_cards(state)]})

    async def health(request: Request) -> Response:
        status = state.status()
        return _json({"status": status}, 503 if status == "dead" else 200)

    async def ready(request: Request) -> Response:
        status = state.status()
        body: dict[str, object] = {"status": status}
        if state.engine is not None:  # load figures for the gateway's admission control
            stats = state.engine.latest_stats
            body.update(waiting=stats.num_waiting, running=stats.num_running, max_num_seqs=config.max_num_seqs)
        return _json(body, 200 if status == "ready" else 503)

    async def metrics(request: Request) -> Response:
        try:
            authorize(request)
        except errors.WorkerError as exc:
            return exc.response()
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def load_curve(request: Request) -> Response:
        try:
            authorize(request)
        except errors.WorkerError as exc:
            return exc.response()
        if state.load_curve is None:
            return errors.WorkerError("no load curve was measured (loading, or --no-load-curve)", status=404,
                                      code="not_found").response()
        return _json(state.load_curve)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else "method_not_allowed"
        return errors.WorkerError(str(exc.detail), status=exc.status_code, code=code).response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # noqa: ANN202
        loading = None if state.engine is not None else asyncio.create_task(state.load())
        try:
            yield
        finally:
            if loading is not None and not loading.done():
                loading.cancel()
            if state.serving is not None and state.serving.prefill is not None:
                await state.serving.prefill.close()
            if state.engine is not None:
                state.engine.shutdown()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embed, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/load_curve", load_curve, methods=["GET"]),  # step costs, for capacity planning
        *adapters.routes(state, authorize),  # LoRA adapters: load, unload, list
        *usage_route.routes(state.usage, authorize),  # a request's final token counts, for billing
        # a prompt's KV blocks for a decode worker (disaggregated serving)
        *disaggregation.prefill_routes(lambda: state.serving.engine if state.serving else None, authorize,
                                       lambda: state.engine.max_model_len),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})


def _header_int(request: Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise errors.invalid(f"{name}: must be an integer, got {raw!r}", None, "invalid_header") from None


def _tenant_weight(request: Request) -> float:
    """X-Tenant-Weight: the tenant's tier's fair-share weight (dataplane/scheduler/fairness.py); 1 if absent."""
    raw = request.headers.get("x-tenant-weight")
    if not raw:
        return 1.0
    try:
        weight = float(raw)
    except ValueError:
        weight = -1.0
    if not 0 < weight <= MAX_WEIGHT:  # NaN fails too
        raise errors.invalid(f"x-tenant-weight: must be a number in (0, {MAX_WEIGHT:g}], got {raw!r}", None,
                             "invalid_header")
    return weight


def _allowance(request: Request) -> int | None:
    """X-Token-Allowance: the tokens the gateway reserved for this request (prompt + completions)."""
    allowance = _header_int(request, "x-token-allowance")
    if allowance is not None and allowance < 0:
        raise errors.invalid(f"x-token-allowance: must be >= 0, got {allowance}", None, "invalid_header")
    return allowance
