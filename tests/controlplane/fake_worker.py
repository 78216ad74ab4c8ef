"""A small OpenAI-shaped upstream for gateway tests and the benchmark: a real HTTP server
(uvicorn in a thread, or `python -m tests.controlplane.fake_worker --port N` as a process).

It serves /health, /ready, /v1/models, /v1/chat/completions and /v1/completions (JSON and SSE),
records what it received (headers included), notices client disconnects, and can be told to be
not ready, slow per token, or to answer with an error status. Like the real worker it honours
`X-Token-Allowance` (clamps max_tokens), opens each stream event with its cumulative counts when
asked (`X-Tessera-Accounting: 1`) and answers /tessera/v1/requests/{id}/usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

import uvicorn

PROMPT_TOKENS = 7
CACHED_TOKENS = 3


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict


@dataclass
class FakeWorker:
    models: list[dict] = field(default_factory=lambda: [
        {"id": "fake-model", "object": "model", "owned_by": "test"},
        {"id": "fake-lora", "object": "model", "owned_by": "test", "parent": "fake-model"},
    ])
    ready: bool = True
    token_delay: float = 0.0  # seconds between streamed tokens
    fail_status: int | None = None  # answer completions with this status
    received: list[Received] = field(default_factory=list)
    disconnected: list[str] = field(default_factory=list)  # request ids whose client went away mid-stream
    finished: list[str] = field(default_factory=list)
    port: int = 0
    record: bool = True
    hold: threading.Event | None = None  # completions wait until the test sets it
    usage: dict[str, dict] = field(default_factory=dict)  # request id -> {"state", counts}: the usage route
    forget_usage: bool = False  # answer the usage route with 404 (a worker that restarted)
    tokens_per_event: int = 1  # tokens each stream event carries (a stop string holding text back sends several)
    linger_after_done: float = 0.0  # seconds between a stream's [DONE] and the end of its body
    answer_text: str | None = None  # a non-streamed answer's text instead of "t0 t1 ..." (a NUL, say)
    server_timing: str | None = None  # a stream's Server-Timing header, as a worker sends it

    def release(self) -> None:
        if self.hold is not None:
            self.hold.set()

    def reset(self) -> None:
        self.ready, self.token_delay, self.fail_status = True, 0.0, None
        self.usage.clear()
        self.forget_usage = False
        self.tokens_per_event = 1
        self.linger_after_done = 0.0
        self.answer_text = None
        self.server_timing = None
        self.release()
        self.hold = None
        self.received.clear()
        self.disconnected.clear()
        self.finished.clear()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- ASGI ---------------------------------------------------------------------------------------

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            return await _json(send, 200, {"status": "ok"})
        if method == "GET" and path == "/ready":
            return await _json(send, 200 if self.ready else 503, {"ready": self.ready})
        if method == "GET" and path == "/v1/models":
            return await _json(send, 200, {"object": "list", "data": self.models})
        if method == "GET" and path.startswith("/tessera/v1/requests/") and path.endswith("/usage"):
            rid = path[len("/tessera/v1/requests/"):-len("/usage")]
            query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
            deadline = time.monotonic() + min(10.0, float(query.get("wait", 0)))
            while self.usage.get(rid, {}).get("state") == "running" and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            entry = None if self.forget_usage else self.usage.get(rid)
            if entry is None:
                return await _json(send, 404, {"error": {"message": "unknown", "type": "invalid_request_error",
                                                         "param": None, "code": "request_not_found"}})
            return await _json(send, 200, {"request_id": rid, **entry})
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            raw = b""
            while True:
                message = await receive()
                raw += message.get("body", b"")
                if not message.get("more_body"):
                    break
            body = json.loads(raw)
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if self.record:
                self.received.append(Received(path, headers, body))
            if self.hold is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.hold.wait, 30)
            if self.fail_status:
                return await _json(send, self.fail_status, {"error": {"message": "injected", "type": "server_error", "param": None, "code": "injected"}})
            chat = path.endswith("chat/completions")
            rid = headers.get("x-request-id", "none")
            # At most a context's worth, as a real engine (the fuzz tests send max_tokens in the tens of thousands).
            n_tokens = min(body.get("max_completion_tokens") or body.get("max_tokens") or 16, 2048)
            if "x-token-allowance" in headers:
                room = int(headers["x-token-allowance"]) - PROMPT_TOKENS
                if room < 1:
                    return await _json(send, 400, {"error": {"message": "prompt over the allowance", "type": "invalid_request_error",
                                                             "param": "messages" if path.endswith("chat/completions") else "prompt",
                                                             "code": "token_allowance_exceeded"}})
                n_tokens = min(n_tokens, room)
            self.usage[rid] = {"state": "running", "status": "running", **_counts(0)}
            if body.get("stream"):
                return await self._stream(send, receive, body, chat, rid, n_tokens,
                                          headers.get("x-tessera-accounting") == "1")
                return await self._stream(send, receive, body, chat, rid, n_tokens)
            if self.token_delay:  # generate "slowly", noticing a client that goes away meanwhile
                began = time.monotonic()
                if await _disconnects_within(receive, self.token_delay * n_tokens):
                    self.disconnected.append(rid)
                    made = min(n_tokens, int((time.monotonic() - began) / self.token_delay))  # generated so far
                    self.usage[rid] = {"state": "finished", "status": "cancelled", **_counts(made)}
                    return
            text = "".join(f"t{i} " for i in range(n_tokens)) if self.answer_text is None else self.answer_text
            choice = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            payload = {
                "id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": body["model"], "choices": [choice], "usage": _usage(n_tokens),
            }
            self.finished.append(rid)
            self.usage[rid] = {"state": "finished", "status": "ok", **_counts(n_tokens)}
            return await _json(send, 200, payload, {"x-request-id": rid})
        return await _json(send, 404, {"error": {"message": "not found", "type": "invalid_request_error", "param": None, "code": None}})

    async def _stream(self, send, receive, body, chat, rid, n_tokens, accounting=False):
        gone = asyncio.Event()

        async def listen():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        listener = asyncio.create_task(listen())
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"x-request-id", rid.encode()),
            *([(b"server-timing", self.server_timing.encode())] if self.server_timing is not None else [])]})
        base = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": body["model"]}
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            per = self.tokens_per_event
            for event in range(-(-n_tokens // per)):
                made = min(n_tokens, (event + 1) * per)  # tokens generated once this event is out
                if self.token_delay:
                    try:
                        await asyncio.wait_for(gone.wait(), self.token_delay)
                    except TimeoutError:
                        pass
                if gone.is_set():
                    self.disconnected.append(rid)
                    # Like the real worker: the tokens it was generating when the client left count too.
                    self.usage[rid] = {"state": "finished", "status": "cancelled", **_counts(made)}
                    return
                choice = {"index": 0, "finish_reason": None, "logprobs": None}
                text = "".join(f"t{i} " for i in range(event * per, made))
                choice.update({"delta": {"content": text}} if chat else {"text": text})
                chunk = {**base, "choices": [choice]}
                if include_usage:
                    chunk["usage"] = None
                self.usage[rid]["completion_tokens"] = made
                frame = _frame(made) if accounting else b""
                await send({"type": "http.response.body", "body": frame + b"data: " + json.dumps(chunk).encode() + b"\n\n", "more_body": True})
            last = {"index": 0, "finish_reason": "length", "logprobs": None}
            last.update({"delta": {}} if chat else {"text": ""})
            events = [{**base, "choices": [last]}]
            if include_usage:
                events.append({**base, "choices": [], "usage": _usage(n_tokens)})
            frame = _frame(n_tokens) if accounting else b""
            data = b"".join(frame + b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            await send({"type": "http.response.body", "body": data + frame + b"data: [DONE]\n\n",
                        "more_body": bool(self.linger_after_done)})
            if self.linger_after_done:  # a client that stops reading at [DONE] may leave before the body ends
                await asyncio.sleep(self.linger_after_done)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.finished.append(rid)
            self.usage[rid] = {"state": "finished", "status": "ok", **_counts(n_tokens)}
        finally:
            listener.cancel()


async def _disconnects_within(receive, seconds: float) -> bool:
    async def gone():
        while (await receive())["type"] != "http.disconnect":
            pass

    try:
        await asyncio.wait_for(gone(), seconds)
        return True
    except TimeoutError:
        return False


def _counts(completion: int) -> dict:
    return {"prompt_tokens": PROMPT_TOKENS, "cached_tokens": CACHED_TOKENS, "completion_tokens": completion}


def _frame(completion: int) -> bytes:
    return b": usage " + json.dumps(_counts(completion)).encode() + b"\n"


def _usage(completion: int) -> dict:
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": completion, "total_tokens": PROMPT_TOKENS + completion,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}}


async def _json(send, status: int, payload: dict, headers: dict | None = None) -> None:
    body = json.dumps(payload).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class ServerThread:
    """Run an ASGI app with uvicorn on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, app, port: int = 0) -> None:
        self.config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="auto")
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> int:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per generated token")
    args = parser.parse_args()
    worker = FakeWorker(record=False, token_delay=args.token_delay)
    uvicorn.run(worker, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
