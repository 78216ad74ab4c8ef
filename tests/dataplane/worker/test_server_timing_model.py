"""A stream's Server-Timing from the real SmolLM2 in-process: where its first token's time went."""

from __future__ import annotations

import time

import httpx
import pytest

from controlplane.gateway.server_timing import parse
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app

from .test_metering_model import MODEL, engine  # noqa: F401  (its module-scoped SmolLM2 engine)

pytestmark = [pytest.mark.slow, pytest.mark.model]


async def test_a_stream_says_its_accept_queue_prefill_and_send(engine):  # noqa: F811
    state = WorkerState(WorkerConfig(model=MODEL), engine)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi. " * 40}], "max_tokens": 4,
            "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w") as c:
        started = time.perf_counter()
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            headers_at = time.perf_counter()
            assert r.status_code == 200
            stages = parse(r.headers["server-timing"])
            await r.aread()
        json_answer = await c.post("/v1/chat/completions", json={**body, "stream": False})
    assert list(stages) == ["accept", "queue", "prefill", "send"]
    assert stages["prefill"] > 0  # 200-odd prompt tokens through the model
    assert sum(stages.values()) <= (headers_at - started) * 1000 + 1  # within what the client waited
    assert "server-timing" not in json_answer.headers  # only a stream's headers wait for its first token
