"""ASGI entry point: `uvicorn controlplane.asgi:application`.

/v1/ (the OpenAI-compatible gateway) goes to a lean handler without middleware; everything else
(admin, management API) to Django's standard handler behind the body cap (controlplane/bodylimit.py:
a 413 before an oversized body is read; the gateway's handler applies the same cap itself). This
wrapper also answers ASGI lifespan events (which Django does not) so that a shutting-down gateway
first finishes its pending usage accounting and closes its worker pool.
"""

from __future__ import annotations

import gc
import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.base")

django_application = get_asgi_application()  # sets Django up

from django.urls import get_resolver  # noqa: E402

from controlplane.bodylimit import capped  # noqa: E402  (needs Django set up)
from controlplane.doors.headers import with_api_headers  # noqa: E402
from controlplane.gateway import upstream  # noqa: E402
from controlplane.gateway.handler import GatewayHandler  # noqa: E402
from controlplane.gateway.routing.workers import get_registry  # noqa: E402
from controlplane.gateway.usage import accounting  # noqa: E402

management_application = capped(django_application)

gateway_application = GatewayHandler()


def _freeze_heap() -> None:
    """Move what start-up made (Django, the URL conf, every view module and its imports) out of the
    cyclic collector's reach. Otherwise each full collection walks all of it: under a flood of refused
    requests a gateway ran one every few seconds, 60-200 ms each on 2 loaded CPUs, and every request in
    flight waited (the premium tenant's TTFT p95 under the flood, benchmarks/gateway.py)."""
    if not settings.TESSERA_GC_FREEZE:
        return
    get_resolver().url_patterns  # noqa: B018  (imports the views, hence the gateway, now rather than at the first request)
    gc.collect()
    gc.freeze()


async def _shutdown() -> None:
    await get_registry().stop()
    await accounting.drain()
    await upstream.close()


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _freeze_heap()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await _shutdown()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})
                return
    elif scope["type"] == "http" and scope["path"].startswith("/v1/"):
        # The hot path (gateway/handler.py); it has no middleware, so its security headers are added here.
        await gateway_application(scope, receive, with_api_headers(send))
    else:
        await management_application(scope, receive, send)
