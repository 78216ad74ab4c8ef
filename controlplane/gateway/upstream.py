"""The shared connection pool to workers: one httpx.AsyncClient per event loop (per process in
production), keep-alive connections reused across requests."""

from __future__ import annotations

import asyncio
import weakref

import httpx
from django.conf import settings

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    existing = _clients.get(loop)
    if existing is None or existing.is_closed:
        existing = httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=settings.TESSERA_UPSTREAM_CONNECT_TIMEOUT,
                read=settings.TESSERA_UPSTREAM_READ_TIMEOUT,
                write=30.0,
                pool=10.0,
            ),
            limits=httpx.Limits(max_connections=2048, max_keepalive_connections=512, keepalive_expiry=60),
            # Workers are addressed directly; never pick up proxy settings from the environment.
            trust_env=False,
        )
        _clients[loop] = existing
    return existing


async def close() -> None:
    loop = asyncio.get_running_loop()
    existing = _clients.pop(loop, None)
    if existing is not None:
        await existing.aclose()


def worker_auth_headers() -> dict[str, str]:
    token = settings.TESSERA_WORKER_TOKEN
    return {"Authorization": f"Bearer {token}"} if token else {}
