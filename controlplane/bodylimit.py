"""The request body cap (TESSERA_MAX_REQUEST_BYTES), enforced at the ASGI layer before a body is read.

A declared Content-Length over the cap is refused with 413 without reading a byte; a body without
one (chunked) is read up to the cap and refused as soon as it passes it. The gateway's handler
reads its bodies itself (gateway/handler.py); everything else (management API, admin) goes through
`capped`, which wraps Django's ASGI handler: Django spools bodies to a temporary file, so without
this a client could make it write any amount to disk before a view ever ran.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestAborted

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

TOO_LARGE_CODE = "request_too_large"


class BodyTooLarge(Exception):
    pass


def limit() -> int:
    return settings.TESSERA_MAX_REQUEST_BYTES


def too_large_message() -> str:
    return f"The request body is too large: at most {limit()} bytes are accepted."


def declared_length(scope: dict[str, Any]) -> int | None:
    """The Content-Length header's value; None when absent; ValueError when it is not a number."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            if not text.isdigit():
                raise ValueError(text)
            return int(text)
    return None


def may_have_body(scope: dict[str, Any], length: int | None) -> bool:
    if length is not None:
        return length > 0
    return scope.get("method", "GET") not in ("GET", "HEAD", "OPTIONS", "DELETE")


async def read_capped(receive: Receive, cap: int) -> bytes:
    """The whole body, in memory (at most `cap` bytes are ever held); BodyTooLarge past the cap,
    RequestAborted when the client disconnects first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_json(send: Send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    body = orjson.dumps(payload)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    # The rest of an unread body is not wanted: ask the client to close rather than send it.
    raw.append((b"connection", b"close"))
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, status: int, detail: str, code: str) -> None:
    """DRF's error format (the management API's; the admin gets the same)."""
    await send_json(send, status, {"detail": detail, "code": code})


def capped(app):
    """Wrap Django's ASGI application with the body cap."""

    async def application(scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        cap = limit()
        try:
            length = declared_length(scope)
        except ValueError:
            await _refuse(send, 400, "The Content-Length header is not a number.", "invalid_content_length")
            return
        if length is not None and length > cap:
            await _refuse(send, 413, too_large_message(), TOO_LARGE_CODE)
            return
        state = {"size": 0, "refused": False}

        async def limited_receive() -> dict[str, Any]:
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["size"] += len(message.get("body", b""))
                if state["size"] > cap:
                    # Answer now; Django, told the client left, stops reading and sends nothing.
                    state["refused"] = True
                    await _refuse(send, 413, too_large_message(), TOO_LARGE_CODE)
                    return {"type": "http.disconnect"}
            return message

        await app(scope, limited_receive, send)

    return application
