"""The ASGI handler for /v1: Django's request objects, URL routing and views, without the
per-request thread hops of the general handler.

Django's ASGIHandler runs each request in its own ThreadSensitiveContext (a thread per request),
runs every MiddlewareMixin hook through sync_to_async (two hops per middleware) and sends the
request_started/finished signals through sync_to_async too. Measured with the fake upstream
(benchmarks/gateway.py, 2 shared CPUs), that was ~8 ms of the gateway's added latency. The
OpenAI endpoints need none of it: no sessions, cookies, CSRF or messages (the caller is a bearer
key), and their database work goes through controlplane.asyncdb.db_call, which manages its own
connections. Client disconnects are still detected and cancel the view, as in Django.
"""

from __future__ import annotations

import asyncio

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix


class GatewayHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def __call__(self, scope, receive, send) -> None:
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
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
