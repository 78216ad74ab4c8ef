"""Sets the audit origin for admin and management-API requests (controlplane/audit/context.py).

Every such response carries `X-Request-Id`, the id its audit events hold. The client's address
follows the platform's one rule (common/client_ip.py): the socket peer, or X-Forwarded-For's
entry for TESSERA_TRUSTED_PROXY_HOPS proxies in front (0 by default: a client writes that header).
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from common.client_ip import client_ip, normalize

from . import context
from .models import Channel


def client_address(request) -> str | None:
    return normalize(client_ip(request)) or None


def origin_for(request) -> context.Origin:
    path = request.path
    channel = Channel.ADMIN if path.startswith("/admin/") else Channel.API if path.startswith("/api/") else Channel.OTHER
    return context.Origin(
        channel=channel, via=f"{request.method} {path}"[:300], client_address=client_address(request),
        request_id=context.new_request_id(), request=request,
    )


class AuditContextMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        origin = origin_for(request)
        with context.acting(origin):
            response = self.get_response(request)
        return _with_request_id(response, origin)

    async def __acall__(self, request):
        origin = origin_for(request)
        with context.acting(origin):
            response = await self.get_response(request)
        return _with_request_id(response, origin)


def _with_request_id(response, origin: context.Origin):
    # A view that has its own id (the gateway's req_..., the one billing deduplicates on) keeps it.
    if "X-Request-Id" not in response:
        response["X-Request-Id"] = origin.request_id
    return response
