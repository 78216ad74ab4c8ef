"""Backpressure and drain on a real worker process: a one-slot engine with a one-request queue."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import openai
import pytest

from .process import MODEL, TOKEN, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.model]

LONG = {"model": MODEL, "prompt": "Once upon a time", "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def worker():
    w = WorkerProcess("--max-num-seqs", "1", "--max-waiting", "1", "--drain-timeout", "60")
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def open_stream(worker: WorkerProcess, max_tokens: int):
    """A running completion stream, with its first event read; returns (response, line iterator)."""
    http = httpx.Client(timeout=60)
    r = http.send(http.build_request("POST", worker.url + "/v1/completions", headers=worker.headers,
                                     json={**LONG, "max_tokens": max_tokens}), stream=True)
    lines = r.iter_lines()
    assert r.status_code == 200
    assert next(line for line in lines if line.startswith("data: "))
    return r, lines


def test_full_queue_is_a_fast_429_with_retry_after(worker):
    client = openai.OpenAI(base_url=worker.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
    running, _ = open_stream(worker, 500)  # holds the only running slot
    queued: dict = {}
    waiter = threading.Thread(target=lambda: queued.setdefault("r", client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=2)))
    waiter.start()
    worker.wait_metric("tessera:num_requests_waiting", lambda v: v == 1)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert time.monotonic() - started < 1.0
    assert err.value.code == "queue_full" and int(err.value.response.headers["retry-after"]) >= 1
    running.close()  # frees the slot: the queued request runs
    waiter.join(30)
    assert queued["r"].choices[0].finish_reason == "length"
    assert worker.metrics()['tessera:request_rejected_total{model_name="smollm2-135m-instruct",reason="queue_full"}'] == 1


def test_sigterm_drains_without_cutting_a_stream_short(worker):
    r, lines = open_stream(worker, 30)
    worker.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while httpx.get(worker.url + "/ready", timeout=5).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused = httpx.post(worker.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                         headers=worker.headers, timeout=5)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert refused.headers["retry-after"]
    rest = [line for line in lines if line.startswith("data: ")]
    r.close()
    assert rest[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in rest[-2]
    assert len(rest) == 30  # 29 more tokens after the first, then [DONE]
    assert worker.proc.wait(30) == 0
