"""POST /v1/responses, GET and DELETE /v1/responses/{id}: the Responses API over the chat path.

A Responses request is translated into a chat-completions request (responses_request.py) and sent
through proxy.handle, so auth, limits, the usage journal, exact metering and budgets are the chat
path's own; the answer or stream is rendered back (responses_render.py). The response id is the
gateway's request id (`resp_<hex>` for `req_<hex>`), so a stored response and its ledger row share it.

`store` (default true) needs PostgreSQL: while the gateway knows the database is down it serves
other requests from memory (docs/reliability.md) but refuses `store: true` with a 503
(`store_unavailable`) before anything is reserved, since the answer could not be continued or
retrieved; `store: false` is served. If the write fails anyway after the answer was generated, the
answer is still delivered (it was billed) with `"store": false`, so the client can tell.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from common.asyncdb import db_call
from common.errors import ApplicationError
from controlplane.gateway import outages, params, proxy
from controlplane.gateway.error_bodies import error_response, json_response
from controlplane.gateway.responses import responses_render, responses_store
from controlplane.gateway.responses.responses_request import ResponsesRequest, parse
from controlplane.gateway.views import openai_endpoint

log = logging.getLogger("tessera.gateway")

SKIPPED_HEADERS = ("content-type", "content-length")
# Chat parameter names in a worker's 400, as the Responses request names them.
PARAMS = (("messages", "input"), ("max_tokens", "max_output_tokens"), ("response_format.json_schema", "text.format"),
          ("response_format", "text.format"))


def _not_found(response_id: str, param: str | None = None) -> ApplicationError:
    return ApplicationError(f"Response with id '{response_id}' not found.", code="not_found", status=404, param=param)


@openai_endpoint("POST")
async def create(request: HttpRequest) -> HttpResponse:
    try:
        principal = await proxy.authenticate(request)
        req = parse(request.body)
        if req.store and outages.recently_down("database"):
            raise ApplicationError("Responses cannot be stored right now; retry shortly, or send `store: false`.",
                                   code="store_unavailable", status=503, param="store", headers={"Retry-After": "5"})
        context: list[dict[str, Any]] = []
        if req.previous_response_id:
            previous = params.object_id(req.previous_response_id, lambda bad: _not_found(bad, "previous_response_id"))
            stored = await db_call(responses_store.stored_response_get, tenant_id=principal.tenant_id,
                                   response_id=previous)
            if stored is None:
                raise _not_found(req.previous_response_id, "previous_response_id")
            context = stored.context
    except ApplicationError as exc:
        return error_response(exc, proxy.new_request_id())
    upstream = await proxy.handle(request, "chat", body=req.chat_body(context), principal=principal)
    if upstream.status_code != 200:
        return _renamed_error(upstream)
    response_id = "resp_" + upstream["x-request-id"].removeprefix("req_")
    response = responses_render.skeleton(response_id, req.body, store=req.store)
    if isinstance(upstream, StreamingHttpResponse):
        out = StreamingHttpResponse(_events(upstream, req, response, principal.tenant_id, context),
                                    content_type="text/event-stream")
    else:
        responses_render.from_chat(response, orjson.loads(upstream.content))
        await _store(req, response, principal.tenant_id, context)
        out = HttpResponse(orjson.dumps(response), content_type="application/json")
    for name, value in upstream.items():
        if name.lower() not in SKIPPED_HEADERS:
            out[name] = value
    return out


def _renamed_error(upstream: HttpResponse) -> HttpResponse:
    """A refusal passes through, its `param` named as in the Responses request."""
    try:
        body = orjson.loads(upstream.content)
        param = body["error"]["param"]
    except (ValueError, KeyError, TypeError):
        return upstream
    for chat, ours in PARAMS:
        if isinstance(param, str) and (param == chat or param.startswith(chat + ".") or param.startswith(chat + "[")):
            body["error"]["param"] = ours + param[len(chat):] if ours != "text.format" else ours
            upstream.content = orjson.dumps(body)
            break
    return upstream


async def _store(req: ResponsesRequest, response: dict[str, Any], tenant_id: int, context: list) -> None:
    """Keep a completed or incomplete response; on a failed write, say so in the answer itself."""
    if not req.store or response["status"] not in ("completed", "incomplete"):
        return
    items = context + responses_render.with_ids(req.items) + responses_render.output_items_for_context(
        response["output"])
    try:
        await db_call(responses_store.stored_response_create, tenant_id=tenant_id, response_id=response["id"],
                      body=response, context=items)
    except Exception:
        log.warning("could not store a response", exc_info=True, extra={"request_id": response["id"]})
        response["store"] = False


async def _events(upstream: StreamingHttpResponse, req: ResponsesRequest, response: dict[str, Any], tenant_id: int,
                  context: list):
    """The chat stream as Responses events. The response is stored before its closing event, so a
    client that continues from it as soon as it sees `response.completed` finds it."""
    relay = upstream.relay
    writer = responses_render.EventWriter(response)
    buffer = b""
    broken = False
    try:
        yield writer.start()
        async for chunk in relay:
            buffer = (buffer + chunk).replace(b"\r\n", b"\n")  # SSE allows CRLF; events end at a blank line
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                out = _translate(writer, event)
                if out:
                    yield out
    except Exception:
        log.warning("responses stream failed", exc_info=True, extra={"request_id": response["id"]})
        broken = True
    finally:
        await relay.aclose()  # the chat relay meters the request as it closes
    if writer.error is None and not broken:
        responses_render.finish(response, writer.finish_reason)
        await _store(req, response, tenant_id, context)
    yield writer.end(broken=broken)


def _translate(writer: responses_render.EventWriter, event: bytes) -> bytes:
    out = []
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            continue
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(writer.chat_event(obj))
    return b"".join(out)


@openai_endpoint("GET", "DELETE")
async def detail(request: HttpRequest, response_id: str) -> HttpResponse:
    request_id = proxy.new_request_id()
    try:
        principal = await proxy.authenticate(request)
        params.object_id(response_id, _not_found)
        if request.method == "DELETE":
            if not await db_call(responses_store.stored_response_delete, tenant_id=principal.tenant_id,
                                 response_id=response_id):
                raise _not_found(response_id)
            return json_response({"id": response_id, "object": "response.deleted", "deleted": True},
                                 request_id=request_id)
        if request.GET.get("stream") not in (None, "false"):
            raise ApplicationError("Unsupported parameter: 'stream' (a stored response is returned whole).",
                                   code="unsupported_parameter", status=400, param="stream")
        stored = await db_call(responses_store.stored_response_get, tenant_id=principal.tenant_id,
                               response_id=response_id)
        if stored is None:
            raise _not_found(response_id)
        return json_response(stored.body, request_id=request_id)
    except ApplicationError as exc:
        return error_response(exc, request_id)


@openai_endpoint("GET")
async def input_items(request: HttpRequest, response_id: str) -> HttpResponse:
    """The items the model saw for this response (earlier turns included, `instructions` not), paged
    as OpenAI's: `order` (default desc), `limit` (1-100, default 20), `after` (an item id)."""
    request_id = proxy.new_request_id()
    try:
        principal = await proxy.authenticate(request)
        order, after = request.GET.get("order", "desc"), request.GET.get("after")
        if order not in ("asc", "desc"):
            raise ApplicationError("Invalid value for 'order': expected 'asc' or 'desc'.", code="invalid_value",
                                   status=400, param="order")
        limit = params.page_limit(request.GET.get("limit"), default=20, maximum=100)
        params.object_id(response_id, _not_found)
        stored = await db_call(responses_store.stored_response_get, tenant_id=principal.tenant_id,
                               response_id=response_id)
        if stored is None:
            raise _not_found(response_id)
        inputs = stored.context[:len(stored.context) - len(stored.body.get("output") or ())]
        items = [responses_render.input_item(item, i) for i, item in enumerate(inputs)]
        if order == "desc":
            items.reverse()
        if after is not None:
            position = next((i for i, item in enumerate(items) if item["id"] == after), None)
            if position is None:
                raise ApplicationError(f"No input item '{after}' in response '{response_id}'.", code="invalid_value",
                                       status=400, param="after")
            items = items[position + 1:]
        page = items[:limit]
        return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit},
                             request_id=request_id)
    except ApplicationError as exc:
        return error_response(exc, request_id)
