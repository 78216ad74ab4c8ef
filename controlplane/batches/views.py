"""/v1/files and /v1/batches: async views in the gateway's style (OpenAI-shaped errors, x-request-id)."""

from __future__ import annotations

import orjson
from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from common.asyncdb import db_call
from common.errors import ApplicationError
from controlplane.gateway import params, proxy
from controlplane.gateway.error_bodies import error_response, json_response
from controlplane.gateway.views import openai_endpoint

from . import files, services

MAX_PAGE = 100
CONTENT_CHUNK = 256 * 1024  # bytes a file's content is sent in


def _limit(request: HttpRequest, default: int = 20) -> int:
    return params.page_limit(request.GET.get("limit"), default=default, maximum=10_000)


# Ids as the client names them (params.object_id): one that cannot exist is the same 404 as an unknown one.
def _file_id(raw: str, param: str = "file_id") -> str:
    return params.object_id(raw, lambda bad: ApplicationError(f"No such File object: {bad}", code="file_not_found",
                                                              status=404, param=param))


def _batch_id(raw: str) -> str:
    return params.object_id(raw, lambda bad: ApplicationError(f"No batch found with id '{bad}'.",
                                                              code="batch_not_found", status=404, param="batch_id"))


def _after(request: HttpRequest, parse) -> str | None:
    raw = request.GET.get("after")
    return parse(raw) if raw else None


async def _answer(request: HttpRequest, work) -> HttpResponse:
    request_id = proxy.new_request_id()
    try:
        principal = await proxy.authenticate(request)
        return await work(principal, request_id)
    except ApplicationError as exc:
        return error_response(exc, request_id)


@openai_endpoint("GET", "POST")
async def files_root(request: HttpRequest) -> HttpResponse:
    async def upload(principal, request_id):
        upload = request.FILES.get("file")
        purpose = request.POST.get("purpose")
        if upload is None:
            raise files.invalid("Missing required parameter: 'file' (multipart/form-data).", "file",
                                "missing_required_parameter")
        if not purpose:
            raise files.invalid("Missing required parameter: 'purpose'.", "purpose", "missing_required_parameter")
        filename = params.nul_free(upload.name or "upload.jsonl", "file")
        stored = await db_call(files.file_create, tenant_id=principal.tenant_id, filename=filename,
                               data=upload.read(), purpose=purpose)
        return json_response(files.file_card(stored), request_id=request_id)

    async def listing(principal, request_id):
        order = request.GET.get("order", "desc")
        if order not in ("asc", "desc"):
            raise files.invalid("Invalid value for 'order': 'asc' or 'desc'.", "order", "invalid_value")
        limit = _limit(request, 10_000)
        purpose = params.nul_free(request.GET.get("purpose"), "purpose")
        found = await db_call(files.file_list, tenant_id=principal.tenant_id, purpose=purpose,
                              limit=limit + 1, after=_after(request, _file_id), ascending=order == "asc")
        data = [files.file_card(f) for f in found[:limit]]
        return json_response(_page(data, len(found) > len(data)), request_id=request_id)

    return await _answer(request, upload if request.method == "POST" else listing)


def _page(data: list[dict], has_more: bool) -> dict:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


@openai_endpoint("GET", "DELETE")
async def file_detail(request: HttpRequest, file_id: str) -> HttpResponse:
    async def work(principal, request_id):
        _file_id(file_id)
        if request.method == "DELETE":
            deleted = await db_call(files.file_delete, tenant_id=principal.tenant_id, file_id=file_id)
            return json_response({"id": deleted, "object": "file", "deleted": True}, request_id=request_id)
        stored = await db_call(files.file_get, tenant_id=principal.tenant_id, file_id=file_id)
        return json_response(files.file_card(stored), request_id=request_id)

    return await _answer(request, work)


@openai_endpoint("GET")
async def file_content(request: HttpRequest, file_id: str) -> HttpResponse:
    async def work(principal, request_id):
        _file_id(file_id)
        stored, handle = await db_call(files.file_open, tenant_id=principal.tenant_id, file_id=file_id)
        # An async iterator: Django would read a sync one whole into memory before serving it (ASGI).
        response = StreamingHttpResponse(_chunks(handle), content_type="application/jsonl")
        response["Content-Length"] = str(stored.bytes)
        response["x-request-id"] = request_id
        return response

    return await _answer(request, work)


async def _chunks(handle):
    """The file's bytes, CONTENT_CHUNK at a time (an output file may hold the tenant's whole cap), read
    off the event loop (the storage may be a network store)."""
    read = sync_to_async(handle.read, thread_sensitive=False)
    try:
        while chunk := await read(CONTENT_CHUNK):
            yield chunk
    finally:
        await sync_to_async(handle.close, thread_sensitive=False)()


@openai_endpoint("GET", "POST")
async def batches_root(request: HttpRequest) -> HttpResponse:
    async def create(principal, request_id):
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            raise files.invalid("The request body is not valid JSON.", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise files.invalid("The request body must be a JSON object.")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise files.invalid(f"Missing required parameter: '{name}' (a string).", name,
                                    "missing_required_parameter")
        batch = await db_call(services.batch_create, tenant_id=principal.tenant_id, api_key_id=principal.key_id,
                              input_file_id=_file_id(body["input_file_id"], "input_file_id"), endpoint=body["endpoint"],
                              completion_window=body["completion_window"],
                              metadata=params.nul_free(body.get("metadata"), "metadata"))
        return json_response(services.batch_card(batch), request_id=request_id)

    async def listing(principal, request_id):
        limit = min(_limit(request), MAX_PAGE)
        found = await db_call(services.batch_list, tenant_id=principal.tenant_id, limit=limit + 1,
                              after=_after(request, _batch_id))
        data = [services.batch_card(b) for b in found[:limit]]
        return json_response(_page(data, len(found) > limit), request_id=request_id)

    return await _answer(request, create if request.method == "POST" else listing)


@openai_endpoint("GET")
async def batch_detail(request: HttpRequest, batch_id: str) -> HttpResponse:
    async def work(principal, request_id):
        _batch_id(batch_id)
        batch = await db_call(services.batch_get, tenant_id=principal.tenant_id, batch_id=batch_id)
        return json_response(services.batch_card(batch), request_id=request_id)

    return await _answer(request, work)


@openai_endpoint("POST")
async def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    async def work(principal, request_id):
        _batch_id(batch_id)
        batch = await db_call(services.batch_cancel, tenant_id=principal.tenant_id, batch_id=batch_id)
        return json_response(services.batch_card(batch), request_id=request_id)

    return await _answer(request, work)
