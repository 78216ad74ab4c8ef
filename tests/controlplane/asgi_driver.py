"""Drive an ASGI application in-process, counting what it reads of the body."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from urllib.parse import quote


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    receive_calls: int  # http.request messages the application asked for
    bytes_read: int = 0
    chunks: list = field(default_factory=list)

    def json(self):
        return json.loads(self.body)


async def call(app, path: str, chunks: list[bytes], *, method: str = "POST", headers: dict[str, str] | None = None,
               content_length: bool = True, timeout: float = 30, query: str | None = None) -> Reply:
    """Send `chunks` as the body (with Content-Length unless content_length=False: chunked). `path` is
    the decoded path; it may carry a query string (`/v1/files?limit=2`) unless `query` (already
    percent-encoded) is given. A `content-type` in `headers` replaces the JSON default."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    headers.setdefault("content-type", "application/json")
    raw_headers = [(b"host", b"testserver")]
    raw_headers += [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
    if query is None:
        path, _, query = path.partition("?")
    if content_length:
        raw_headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
    else:
        raw_headers.append((b"transfer-encoding", b"chunked"))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": quote(path).encode(), "query_string": query.encode(), "root_path": "", "headers": raw_headers,
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }
    pending = list(chunks)
    done = asyncio.Event()
    state = {"calls": 0, "bytes": 0, "status": None, "headers": {}, "body": b""}

    async def receive():
        if pending:
            state["calls"] += 1
            chunk = pending.pop(0)
            state["bytes"] += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        if state["calls"] == 0 and not chunks:
            state["calls"] += 1
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            state["status"] = message["status"]
            state["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            state["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                done.set()

    await asyncio.wait_for(app(scope, receive, send), timeout)
    return Reply(state["status"], state["headers"], state["body"], state["calls"], state["bytes"])


def chat_body(size: int, **extra) -> bytes:
    """A chat request of about `size` bytes."""
    body = {"model": "fake-model", "max_tokens": 2, **extra,
            "messages": [{"role": "user", "content": ""}]}
    base = len(json.dumps(body))
    body["messages"][0]["content"] = "x" * max(0, size - base)
    return json.dumps(body).encode()
