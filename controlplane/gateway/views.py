"""The OpenAI-compatible endpoints: async Django views, no DRF on the hot path."""

from __future__ import annotations

import functools
import logging
import time

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.errors import ApplicationError

from . import outages, proxy
from .responses import error_response, json_response
from .workers import get_registry, visible_to

_STARTED = int(time.time())
log = logging.getLogger("tessera.gateway")


def openai_endpoint(*methods: str):
    """OpenAI-shaped answers on every path: 405 for other methods, 503 while a dependency is down,
    500 (logged) for bugs, and x-request-id on all of them."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                error = ApplicationError(f"Method {request.method} is not allowed here.", code="method_not_allowed", status=405)
                response = error_response(error, proxy.new_request_id())
                response["Allow"] = ", ".join(methods)
                return response
            try:
                return await view(request, *args, **kwargs)
            except Exception as exc:
                request_id = proxy.new_request_id()
                error = outages.unavailable(exc, request_id)  # a dependency outage: 503, not 500
                if error is None:
                    log.exception("gateway error", extra={"request_id": request_id, "path": request.path})
                    error = ApplicationError("The gateway had an internal error.", code="internal_error", status=500)
                return error_response(error, request_id)

        return wrapper

    return decorate


@openai_endpoint("POST")
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await proxy.handle(request, "chat")


@openai_endpoint("POST")
async def completions(request: HttpRequest) -> HttpResponse:
    return await proxy.handle(request, "completions")


@openai_endpoint("POST")
async def embeddings(request: HttpRequest) -> HttpResponse:
    return await proxy.handle(request, "embeddings")


def _card(target) -> dict:
    card = {"id": target.name, "object": "model", "created": _STARTED, "owned_by": "tessera"}
    if target.adapter is not None:
        card["parent"] = target.base
    return card


async def _visible_models(request: HttpRequest):
    principal = await proxy.authenticate(request)
    registry = get_registry()
    await registry.ensure_polling()
    return [
        target
        for target in registry.known_models().values()
        if visible_to(target, principal.tenant_id) and principal.may_use(target.base, target.adapter)
    ]


@openai_endpoint("GET")
async def models(request: HttpRequest) -> HttpResponse:
    request_id = proxy.new_request_id()
    try:
        targets = await _visible_models(request)
    except ApplicationError as exc:
        return error_response(exc, request_id)
    data = [_card(t) for t in sorted(targets, key=lambda t: t.name)]
    return json_response({"object": "list", "data": data}, request_id=request_id)


@openai_endpoint("GET")
async def model_detail(request: HttpRequest, model: str) -> HttpResponse:
    request_id = proxy.new_request_id()
    try:
        for target in await _visible_models(request):
            if target.name == model:
                return json_response(_card(target), request_id=request_id)
        raise ApplicationError(
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found", status=404, param="model",
        )
    except ApplicationError as exc:
        return error_response(exc, request_id)


@openai_endpoint("GET", "POST", "PUT", "PATCH", "DELETE")
async def not_found(request: HttpRequest, rest: str) -> HttpResponse:
    error = ApplicationError(f"Unknown endpoint /v1/{rest}.", code="unknown_url", status=404)
    return error_response(error, proxy.new_request_id())
