"""A client that leaves aborts its engine request: streaming, mid-stream or still queued, and not."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app

from .fakes import FakeEngine


async def call(app, body: dict, path: str, leave_after: float) -> list[dict]:
    """Drive the ASGI app by hand; the client disconnects `leave_after` seconds after sending."""
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(leave_after)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "scheme": "http", "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"r1")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8100)}
    await asyncio.wait_for(app(scope, receive, send), 5)
    return sent


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("queued", [True, False])
async def test_disconnect_aborts_the_engine_request(stream, queued):
    engine = FakeEngine(delay=0.02, gate=asyncio.Event() if queued else None)  # queued: never gets a token
    state = WorkerState(WorkerConfig(model="fake"), engine)
    app = create_app(state)
    sent = await call(app, {"prompt": "x", "max_tokens": 50, "stream": stream}, "/v1/completions", 0.2)
    assert engine.aborted == ["r1"]
    assert state.drainer.inflight == 0  # the admission ticket went back
    bodies = b"".join(m.get("body", b"") for m in sent)
    assert b"[DONE]" not in bodies
    metrics = state.metrics.render().decode()
    assert 'finished_reason="abort"' in metrics


async def test_client_gone_before_the_stream_starts_still_aborts_and_accounts():
    """The first delta arrived (headers not yet sent) and the client is already gone when the response
    starts: the stream body never runs, yet the engine request is aborted and the request logged."""
    engine = FakeEngine(delay=0.02)
    state = WorkerState(WorkerConfig(model="fake"), engine)
    app = create_app(state)
    calls = 0
    messages = [{"type": "http.request", "body": orjson.dumps({"prompt": "x", "max_tokens": 50, "stream": True}),
                 "more_body": False}]

    async def receive():
        nonlocal calls
        if messages:
            return messages.pop()
        calls += 1
        if calls == 1:  # the watcher while waiting for the first delta: never fires
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message):
        await asyncio.sleep(0.01)  # a slow socket: the disconnect is seen before the body starts

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "scheme": "http", "headers": [(b"x-request-id", b"r2")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8100)}
    await asyncio.wait_for(app(scope, receive, send), 5)
    assert engine.aborted == ["r2"] and state.drainer.inflight == 0
    assert 'finished_reason="abort"' in state.metrics.render().decode()
