"""The OpenAI-compatible endpoints: async Django views, no DRF on the hot path."""

from __future__ import annotations

import functools
import logging
import time

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.db import DataError
from django.http import HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.views.decorators.csrf import csrf_exempt

from common.errors import ApplicationError
from controlplane import bodylimit
from controlplane.gateway import outages, proxy
from controlplane.gateway.error_bodies import error_response, json_response
from controlplane.gateway.routing.workers import get_registry, visible_to

_STARTED = int(time.time())
log = logging.getLogger("tessera.gateway")


def client_error(exc: BaseException, request: HttpRequest) -> ApplicationError | None:
    """The 4xx for an exception that says the request was malformed, or None (then it is a bug: a 500).

    Django's own handler answers these 400 (413) in HTML; /v1 runs below it (handler.py), so without
    this a multipart body with no boundary, or more than DATA_UPLOAD_MAX_NUMBER_FILES files, was a 500.
    A value the database refuses (PostgreSQL: a NUL in text or jsonb, a number out of range) that got
    past the views' parsing (params.py) is answered as the management API answers it: 400, logged.
    """
    if isinstance(exc, RequestDataTooBig):
        return ApplicationError(bodylimit.too_large_message(), code=bodylimit.TOO_LARGE_CODE, status=413)
    if isinstance(exc, TooManyFilesSent):
        return ApplicationError(f"Too many files in the form: at most {settings.DATA_UPLOAD_MAX_NUMBER_FILES}.",
                                code="invalid_request", status=400, param="file")
    if isinstance(exc, TooManyFieldsSent):
        return ApplicationError(f"Too many fields in the form: at most {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}.",
                                code="invalid_request", status=400)
    if isinstance(exc, MultiPartParserError | BadRequest | SuspiciousOperation):
        return ApplicationError(f"The request body could not be parsed: {exc}", code="invalid_request", status=400)
    if isinstance(exc, DataError):
        log.warning("database refused a request's value: %s", exc, extra={"path": request.path})
        return ApplicationError("A value in the request is not acceptable (out of range or an invalid character).",
                                code="invalid_value", status=400)
    return None


def openai_endpoint(*methods: str):
    """OpenAI-shaped answers on every path: 405 for other methods, 503 while a dependency is down,
    4xx for a request Django or the database could not take (client_error), 500 (logged) for bugs,
    and x-request-id on all of them."""

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
                error = error or client_error(exc, request)
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
