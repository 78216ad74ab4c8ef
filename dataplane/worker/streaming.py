"""Server-sent events with cancellation: a client that leaves aborts its engine request.

Disconnects are watched on the ASGI `receive` channel (`http.disconnect`), not inferred from a
failing `send`: a request still queued in the engine sends nothing, yet must be aborted as soon
as its client is gone. The work runs as a task racing the watcher; when the watcher wins the task
is cancelled, which closes the engine's generator, which aborts the request within one step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work finished; the work was cancelled."""


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it (and wait for its cleanup) and raise
    ClientGone. Cancelling the caller cancels `work` too."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _cancel(task, watcher)
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    await _cancel(task, watcher)
    raise ClientGone


async def _cancel(*tasks: asyncio.Future) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class EventStream(Response):
    """`text/event-stream` from an async iterator of bytes, one `send` (one flush) per item."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], close: Callable[[], Awaitable[None]],
                 headers: dict[str, str] | None = None) -> None:
        self.events = events
        self.close = close  # releases what `events` holds, even if it never started
        self.status_code = 200
        self.background = None
        self.on_close: Callable[[bool], None] = lambda gone: None  # then this, True when the client left early
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False
        try:
            await race_disconnect(receive, self._stream(send))
        except ClientGone:
            gone = True
        finally:
            await self.events.aclose()  # type: ignore[attr-defined]
            await self.close()
            self.on_close(gone)

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
