"""Exact metering against a scripted engine: the gateway's token allowance, the accounting comment
that opens each stream event, and the usage route the gateway asks after a partial stream."""

from __future__ import annotations

import asyncio
import re

import orjson
import pytest

from dataplane.worker.routes import create_app

from .test_routes import CHAT, make, sse

PROMPT = len("<user>hi<assistant>")  # the fake chat template's tokens (one per character)
ACCOUNTING = {"X-Tessera-Accounting": "1"}


def frames(text: str) -> list[tuple[dict, str]]:
    """Each event's accounting counts and its data line; fails if an event has no accounting line."""
    out = []
    for block in filter(None, text.split("\n\n")):
        comment, data = block.split("\n")
        assert comment.startswith(": usage ") and data.startswith("data: "), block
        out.append((orjson.loads(comment[len(": usage "):]), data[len("data: "):]))
    return out


# -- the allowance ------------------------------------------------------------------------------
@pytest.mark.parametrize("path,body,allowance,param,choices", [
    ("/v1/chat/completions", CHAT, PROMPT, "messages", 1),  # the prompt fits, one token does not
    ("/v1/completions", {"prompt": ["x", "yy"], "n": 2, "max_tokens": 3}, 6, "prompt", 4),  # 3 + 4 > 6
])
async def test_a_prompt_that_leaves_no_room_is_refused_before_queueing(path, body, allowance, param, choices):
    engine, _, client = make()
    r = await client.post(path, json=body, headers={"X-Token-Allowance": str(allowance), "X-Request-Id": "big"})
    assert r.status_code == 400 and engine.calls == []
    err = r.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "token_allowance_exceeded", param)
    prompt = PROMPT if param == "messages" else 3
    assert err["message"].startswith(f"The prompt has {prompt} tokens; this request was allowed {allowance} tokens "
                                     "in all under your limits (prompt + completions)")
    assert f"{choices} completion(s)" in err["message"]
    assert (await client.get("/tessera/v1/requests/big/usage")).status_code == 404  # it never started


async def test_completions_are_clamped_so_the_whole_request_fits_the_allowance():
    engine, _, client = make()
    # 3 prompt tokens + 4 choices; 16 tokens allowed: (16 - 3) // 4 = 3 each, not the 10 asked for.
    body = {"prompt": ["x", "yy"], "n": 2, "max_tokens": 10}
    r = await client.post("/v1/completions", json=body, headers={"X-Token-Allowance": "16"})
    usage = r.json()["usage"]
    assert [c.params.max_tokens for c in engine.calls] == [3, 3]
    assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] + usage["completion_tokens"] <= 16
    assert [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 4
    # The chat default (5 here) is clamped too; an ample allowance changes nothing; no header, no limit.
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": None, "stream": True},
                          headers={"X-Token-Allowance": str(PROMPT + 2)})
    assert engine.calls[-1].params.max_tokens == 2 and sse(r.text)[-2]["choices"][0]["finish_reason"] == "length"
    await client.post("/v1/chat/completions", json=CHAT, headers={"X-Token-Allowance": "1000"})
    await client.post("/v1/chat/completions", json=CHAT)
    assert [c.params.max_tokens for c in engine.calls[-2:]] == [3, 3]


@pytest.mark.parametrize("value", ["many", "-1", "1.5", "0x10"])
async def test_a_malformed_allowance_is_a_400(value):
    engine, _, client = make()
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Token-Allowance": value})
    assert r.status_code == 400 and engine.calls == []
    err = r.json()["error"]
    assert err["code"] == "invalid_header" and "x-token-allowance" in err["message"]


# -- accounting frames --------------------------------------------------------------------------
async def test_each_stream_event_opens_with_the_cumulative_counts_only_when_asked():
    _, _, client = make()
    body = {"prompt": ["xy", "zzzz"], "n": 2, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    plain = await client.post("/v1/completions", json=body, headers={"X-Request-Id": "p"})
    counted = await client.post("/v1/completions", json=body, headers={"X-Request-Id": "p", **ACCOUNTING})
    assert ": usage" not in plain.text
    # Without the comment lines the stream is the same, byte for byte (but for `created`, a clock).
    stripped = re.sub(r": usage [^\n]*\n", "", counted.text)
    assert re.sub(r'"created":\d+', "", stripped) == re.sub(r'"created":\d+', "", plain.text)

    events = frames(counted.text)
    assert events[-1][1] == "[DONE]" and events[-2][1].startswith('{"id"')
    usage = orjson.loads(events[-2][1])["usage"]
    final = {"prompt_tokens": 6, "cached_tokens": 1 + 2, "completion_tokens": 12}  # the fake caches half
    assert events[-1][0] == events[-2][0] == final
    assert usage["prompt_tokens"] == 6 and usage["completion_tokens"] == 12
    assert usage["prompt_tokens_details"]["cached_tokens"] == 3
    made = [counts["completion_tokens"] for counts, _ in events]
    assert made == sorted(made) and made[0] >= 2  # never behind what the event itself carries
    # Each delta event's count covers every token sent so far, and no more than was generated.
    sent = 0
    for counts, data in events[:-2]:
        sent += len(orjson.loads(data)["choices"][0]["text"])
        assert sent <= counts["completion_tokens"] <= 12


async def test_an_in_band_error_event_carries_the_counts_too():
    _, _, client = make(error_at=2, delay=0.02)  # paced: each event is written before the next token comes
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5, "stream": True}, headers=ACCOUNTING)
    events = frames(r.text)
    assert orjson.loads(events[-1][1])["error"]["code"] == "internal_error"
    assert [counts["completion_tokens"] for counts, _ in events] == [1, 2, 2]
    assert events[-1][0]["prompt_tokens"] == PROMPT


# -- the usage route ----------------------------------------------------------------------------
async def test_the_usage_route_answers_final_counts_by_request_id():
    _, _, client = make(token="secret")
    auth = {"Authorization": "Bearer secret"}
    r = await client.post("/v1/chat/completions", json={**CHAT, "n": 2}, headers={"X-Request-Id": "req_1", **auth})
    assert r.status_code == 200
    assert (await client.get("/tessera/v1/requests/req_1/usage")).status_code == 401
    got = await client.get("/tessera/v1/requests/req_1/usage", headers=auth)
    assert got.json() == {"request_id": "req_1", "state": "finished", "status": "ok", "prompt_tokens": PROMPT,
                          "cached_tokens": PROMPT // 2, "completion_tokens": 6}
    missing = await client.get("/tessera/v1/requests/nobody/usage", headers=auth)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "request_not_found"
    assert missing.json()["error"]["type"] == "invalid_request_error"
    from dataplane.worker.usage_route import _wait

    bad = await client.get("/tessera/v1/requests/req_1/usage?wait=soon", headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "wait"
    assert (_wait(None), _wait("0.5"), _wait("1e9")) == (0.0, 0.5, 10.0)  # capped at 10 s
    for raw in ("-1", "nan"):
        with pytest.raises(Exception, match="wait"):
            _wait(raw)


async def test_wait_answers_running_when_it_elapses_and_finished_as_soon_as_it_ends():
    engine, _, client = make(gate=asyncio.Event())
    call = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4},
                                             headers={"X-Request-Id": "slow"}))
    while not engine.calls:
        await asyncio.sleep(0.01)
    running = (await client.get("/tessera/v1/requests/slow/usage?wait=0.1")).json()
    assert (running["state"], running["status"], running["completion_tokens"]) == ("running", "running", 0)
    waiting = asyncio.ensure_future(client.get("/tessera/v1/requests/slow/usage?wait=5"))
    await asyncio.sleep(0.05)
    engine.gate.set()
    finished = (await waiting).json()
    assert (finished["state"], finished["status"], finished["completion_tokens"]) == ("finished", "ok", 4)
    assert (await call).json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("slow_socket", [False, True])
async def test_a_gateway_that_leaves_mid_stream_gets_the_final_count_with_wait(slow_socket):
    """The gateway drops the connection, then at once asks with `wait`: the answer is final (the engine
    request aborted), and counts at least every token in the events it received. Behind a slow socket
    the tokens generated meanwhile were never sent, and count all the same."""
    engine, state, client = make(delay=0.005 if slow_socket else 0.01, max_model_len=512)
    app = create_app(state)
    received: list[bytes] = []
    leave = asyncio.Event()
    messages = [{"type": "http.request", "more_body": False,
                 "body": orjson.dumps({"prompt": "x", "max_tokens": 200, "stream": True})}]

    async def receive():
        if messages:
            return messages.pop()
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if slow_socket:
            await asyncio.sleep(0.05)  # a write that waits for the peer to read
        if message.get("body"):
            received.append(message["body"])
            if len(received) == 5:
                leave.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "scheme": "http", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8100),
             "headers": [(b"x-request-id", b"gone"), (b"x-tessera-accounting", b"1")]}
    serving = asyncio.ensure_future(app(scope, receive, send))
    await asyncio.wait_for(leave.wait(), 5)
    answer = (await client.get("/tessera/v1/requests/gone/usage?wait=5")).json()
    await asyncio.wait_for(serving, 5)
    events = frames(b"".join(received).decode())
    sent = sum(len(orjson.loads(data)["choices"][0]["text"]) for _, data in events)
    assert (answer["state"], answer["status"]) == ("finished", "cancelled")
    assert answer["completion_tokens"] >= max(sent, events[-1][0]["completion_tokens"]) >= 5
    assert answer["completion_tokens"] < 200 and engine.aborted == ["gone"]
    if slow_socket:  # ~0.25 s at a token per 5 ms: far more was generated than the 5 events sent
        assert answer["completion_tokens"] > sent + 10, (answer, sent)
