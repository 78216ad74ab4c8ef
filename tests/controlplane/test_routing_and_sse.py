"""Pure pieces of the gateway: worker choice, the SSE relay's metering, OpenAI header formats."""

from __future__ import annotations

import json

from controlplane.gateway.error_bodies import duration
from controlplane.gateway.routing.workers import ModelTarget, Registry
from controlplane.gateway.sse import StreamMeter

MODEL = {"m": ModelTarget("m", "m", None)}


def registry(n: int) -> Registry:
    reg = Registry([f"http://w{i}" for i in range(n)])
    for worker in reg.workers:
        worker.ready, worker.models = True, dict(MODEL)
    return reg


def test_prefix_affinity_is_stable_and_spreads_prefixes():
    reg = registry(4)
    chosen = {reg.pick("m", b"system prompt A").url for _ in range(20)}
    assert len(chosen) == 1  # the same prefix always lands on the same worker
    spread = {reg.pick("m", f"prefix {i}".encode()).url for i in range(64)}
    assert len(spread) == 4  # different prefixes use every worker


def test_affinity_yields_to_load():
    reg = registry(3)
    preferred = reg.pick("m", b"hot prefix")
    preferred.outstanding = 10
    other = reg.pick("m", b"hot prefix")
    assert other is not preferred  # too far above the least loaded
    preferred.outstanding = 2  # within the slack: affinity wins again
    assert reg.pick("m", b"hot prefix") is preferred


def test_only_ready_workers_serving_the_model_are_candidates():
    reg = registry(3)
    reg.workers[0].ready = False
    reg.workers[1].models = {}
    assert {reg.pick("m", str(i).encode()).url for i in range(20)} == {"http://w2"}
    assert reg.pick("m", b"x", exclude={"http://w2"}) is None
    assert reg.pick("other", b"x") is None


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def test_stream_meter_counts_strips_usage_and_handles_split_events():
    chunks = [sse({"choices": [{"delta": {"content": "a"}}], "usage": None}),
              sse({"choices": [{"delta": {"content": "b"}}], "usage": None}),
              sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
              sse(b"[DONE]")]
    raw = b"".join(chunks)
    meter = StreamMeter(kind="chat", strip_usage=True)
    out = b"".join(meter.feed(raw[i:i + 7]) for i in range(0, len(raw), 7)) + meter.flush()
    assert out == chunks[0] + chunks[1] + chunks[3]
    assert meter.delivered_tokens == 2 and meter.usage["completion_tokens"] == 2 and meter.done

    keep = StreamMeter(kind="chat", strip_usage=False)
    assert keep.feed(raw) == raw


def test_stream_meter_completions_and_crlf():
    meter = StreamMeter(kind="completions", strip_usage=False)
    out = meter.feed(b'data: {"choices": [{"text": "x"}]}\r\n\r\ndata: {"choices": [{"text": ""}]}\r\n\r\n')
    assert out.count(b"data:") == 2 and meter.delivered_tokens == 1


def test_reset_durations_look_like_openais():
    assert duration(0.02) == "20ms"
    assert duration(1) == "1s"
    assert duration(1.5) == "1.5s"
    assert duration(360) == "6m0s"
    assert duration(3723) == "1h2m3s"


def test_accounting_lines_are_read_and_never_forwarded():
    from controlplane.gateway.sse import StreamMeter

    meter = StreamMeter(kind="chat", strip_usage=True)
    out = meter.feed(b': usage {"prompt_tokens":9,"cached_tokens":2,"completion_tokens":5}\n'
                     b'data: {"choices": [{"delta": {"content": "hello"}}]}\n\n'
                     b': usage {"prompt_tokens":9,"cached_tokens":2,"completion_tokens":7}\ndata: [DO')
    assert out == b'data: {"choices": [{"delta": {"content": "hello"}}]}\n\n'
    assert (meter.worker_counts.prompt_tokens, meter.worker_counts.completion_tokens) == (9, 5)
    assert meter.flush() == b"data: [DO" and meter.worker_counts.completion_tokens == 7  # an unterminated tail
    meter.feed(b': usage {"prompt_tokens":"x"}\ndata: [DONE]\n\n')  # malformed: ignored, the event still goes
    assert meter.done and meter.worker_counts.completion_tokens == 7
