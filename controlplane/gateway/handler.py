"""The ASGI handler for /v1: Django's request objects, URL routing and views, without the
per-request thread hops of the general handler.

Django's ASGIHandler runs each request in its own ThreadSensitiveContext (a thread per request),
runs every MiddlewareMixin hook through sync_to_async (two hops per middleware) and sends the
request_started/finished signals through sync_to_async too. Measured with the fake upstream
(benchmarks/gateway.py, 2 shared CPUs), that was ~8 ms of the gateway's added latency. The
OpenAI endpoints need none of it: no sessions, cookies, CSRF or messages (the caller is a bearer
key), and their database work goes through common.asyncdb.db_call, which manages its own
connections. Client disconnects are still detected and cancel the view, as in Django.

Bodies are capped (TESSERA_MAX_REQUEST_BYTES, controlplane/bodylimit.py) before they are read: a
declared Content-Length over the cap is a 413 at once, a chunked body is read in memory up to the
cap and refused as soon as it passes it. A request with a body must also show a well-formed bearer
key before the body is read, and a large (or chunked) one a key that exists, so an anonymous
client cannot make the gateway take in megabytes.

A tenant its limits refuse from memory (tenants/limits/refusals.py: out of requests per minute) is
answered here, once the body is read, without a Django request, URL resolution or the view's tasks:
under a flood of such requests that was most of what each 429 cost (proxy.remembered_refusal makes
the same checks as the view, in the same order, and leaves any other answer to it).
"""

from __future__ import annotations

import asyncio
import io
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix, set_urlconf
from django.utils.log import log_response

from common.client_ip import client_ip_from_scope
from common.errors import ApplicationError
from controlplane import bodylimit
from controlplane.gateway.proxy import new_request_id, principal_for, remembered_refusal
from tenants import auth_throttle

log = logging.getLogger("tessera.gateway")

# Bodies above this (or of unknown size) are read only once the key has been looked up, not just
# seen to be well formed; below it, reading costs less than a second lookup would.
AUTH_BEFORE_READING_BYTES = 64 * 1024
METERED = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


async def _send_error(send, exc: ApplicationError) -> None:
    await bodylimit.send_json(send, exc.status, exc.openai_body(), {**exc.headers, "x-request-id": new_request_id()})


def _too_large() -> ApplicationError:
    return ApplicationError(bodylimit.too_large_message(), code=bodylimit.TOO_LARGE_CODE, status=413,
                            type="invalid_request_error")


def _authorization(scope) -> str | None:
    return next((value.decode("latin-1") for name, value in scope.get("headers", ())
                 if name.lower() == b"authorization"), None)


async def _authenticate_before_reading(scope, length: int | None) -> None:
    """Refuse (ApplicationError) a request whose key cannot be valid, without reading its body: its
    shape always, the key itself for a large or chunked body. The view authenticates again (from the
    process cache when it is on)."""
    header = _authorization(scope)
    await auth_throttle.guarded(client_ip_from_scope(scope), header, principal_for,
                                lookup=length is None or length > AUTH_BEFORE_READING_BYTES)


class GatewayHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def __call__(self, scope, receive, send) -> None:
        await self.handle(scope, receive, send)

    async def get_response_async(self, request):
        # Django's own version logs every 4xx through sync_to_async: a thread hop per answer, which was
        # most of what a 429 cost under a flood of refused requests. The gateway's 4xx are the client's
        # answers (their django.request warning goes nowhere in the default logging set-up); 5xx are still
        # logged as Django does (its error handlers may block: mail to the admins), off the event loop.
        set_urlconf(settings.ROOT_URLCONF)
        response = await self._middleware_chain(request)
        response._resource_closers.append(request.close)
        if response.status_code >= 500:
            await sync_to_async(log_response, thread_sensitive=False)(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response

    async def handle(self, scope, receive, send) -> None:
        cap = bodylimit.limit()
        try:
            length = bodylimit.declared_length(scope)
        except ValueError:
            await _send_error(send, ApplicationError("The Content-Length header is not a number.",
                                                     code="invalid_content_length", status=400))
            return
        if length is not None and length > cap:
            await _send_error(send, _too_large())
            return
        if bodylimit.may_have_body(scope, length):
            try:
                await _authenticate_before_reading(scope, length)
            except ApplicationError as exc:
                await _send_error(send, exc)
                return
            except Exception:  # the database is down, say: the view decides, after reading the body
                log.warning("key lookup before reading the body failed", exc_info=True)
        try:
            body = await bodylimit.read_capped(receive, cap)
        except RequestAborted:
            return
        except bodylimit.BodyTooLarge:
            await _send_error(send, _too_large())
            return
        kind = METERED.get(scope["path"]) if scope["method"] == "POST" else None
        if kind is not None:
            refused = await remembered_refusal(_authorization(scope), body, kind)
            if refused is not None:
                await self.send_response(refused, send)
                return
        body_file = io.BytesIO(body)
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:  # an undecodable path or header: Django's 400, in OpenAI's shape
            body_file.close()
            await _send_error(send, ApplicationError(f"Bad request ({error_response.status_code}).",
                                                     code="invalid_request", status=error_response.status_code))
            return

        async def process_request() -> None:
            response = await self.get_response_async(request)
            response._handler_class = self.__class__
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # client disconnected while we were sending

        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        worker = asyncio.create_task(process_request())
        try:
            await asyncio.wait([listener, worker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listener, worker):  # the listener first: it never raises anything unexpected
                if task.done():
                    try:
                        task.result()
                    except (RequestAborted, asyncio.CancelledError):
                        pass
                else:
                    task.cancel()  # a disconnect cancels the view, which cancels the worker request
                    try:
                        await task
                    except (RequestAborted, asyncio.CancelledError):
                        pass
            body_file.close()
