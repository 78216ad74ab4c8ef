"""Per-request limits answered with OpenAI's 400 error shape: stop sequences and stop token ids."""

from __future__ import annotations

import httpx
import pytest

from dataplane.sampling_params import MAX_STOP_CHARS, MAX_STOP_TOKEN_IDS
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app

from .fakes import FakeEngine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def client_for(engine: FakeEngine) -> httpx.AsyncClient:
    state = WorkerState(WorkerConfig(model="fake", max_n=4, default_max_tokens=5), engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")


@pytest.mark.parametrize("path,extra,param,says", [
    ("/v1/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences"),
    ("/v1/completions", {"stop": "x" * (MAX_STOP_CHARS + 1)}, "stop", f"at most {MAX_STOP_CHARS} are accepted"),
    ("/v1/completions", {"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids",
     f"at most {MAX_STOP_TOKEN_IDS}"),
])
async def test_stop_limits_are_400s_naming_the_field(path, extra, param, says):
    engine = FakeEngine()
    body = {**CHAT, **extra} if "chat" in path else {"model": "fake", "prompt": "hi", "max_tokens": 2, **extra}
    r = await client_for(engine).post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, "invalid_value")
    assert says in err["message"] and not engine.calls


async def test_four_stop_sequences_reach_the_engine():
    engine = FakeEngine()
    r = await client_for(engine).post("/v1/chat/completions", json={**CHAT, "stop": ["a", "b", "c", "x" * MAX_STOP_CHARS]})
    assert r.status_code == 200, r.text
    assert engine.calls[0].params.stop == ["a", "b", "c", "x" * MAX_STOP_CHARS]
