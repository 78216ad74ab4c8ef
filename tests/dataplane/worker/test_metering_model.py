"""Exact metering with the real SmolLM2 in-process: the chat template's tokens, and a stop string the
detokenizer holds whole choices back for (the billing issue's reproduction)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from dataplane.config import CacheConfig, ModelConfig
from dataplane.engine.async_llm import AsyncLLM
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app

from .test_metering import ACCOUNTING, frames

pytestmark = [pytest.mark.slow, pytest.mark.model]

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def engine(smollm_fp32):
    llm = AsyncLLM(ModelConfig(MODEL, dtype="float32"), CacheConfig(kv_cache_memory="32MiB"), progress=False,
                   preloaded=smollm_fp32)
    yield llm
    llm.shutdown()


def client(engine: AsyncLLM) -> httpx.AsyncClient:
    state = WorkerState(WorkerConfig(model=MODEL), engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")


async def test_a_stream_whose_stop_string_holds_choices_back_is_counted_token_by_token(engine):
    """n=2, ignore_eos, and a stop string the model never writes: the detokenizer holds each choice's
    text back until it ends, so 80 tokens arrive in a handful of delta events. The counts on the
    events and from the usage route are the tokens generated, not the deltas."""
    body = {"model": MODEL, "messages": MESSAGES, "n": 2, "temperature": 1, "max_tokens": 40, "ignore_eos": True,
            "stop": ["\u00a7" * 256], "stream": True, "stream_options": {"include_usage": True}}
    async with client(engine) as c:
        r = await c.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "held", **ACCOUNTING})
        events = frames(r.text)
        reported = (await c.get("/tessera/v1/requests/held/usage")).json()
    chunks = [(counts, orjson.loads(data)) for counts, data in events[:-1]]
    content = [(counts, ch) for counts, ch in chunks if any(x["delta"].get("content") for x in ch["choices"])]
    assert len(content) <= 4  # the old delta count would have billed 4 tokens, or fewer
    for counts, ch in content:  # an event carrying a whole choice counts all of its tokens, and more
        assert counts["completion_tokens"] >= 40, (counts, ch)
    usage = chunks[-1][1]["usage"]
    assert usage["completion_tokens"] == 80
    assert events[-1][0] == {"prompt_tokens": usage["prompt_tokens"], "cached_tokens":
                             usage["prompt_tokens_details"]["cached_tokens"], "completion_tokens": 80}
    assert reported == {"request_id": "held", "state": "finished", "status": "ok", **events[-1][0]}
    assert reported["prompt_tokens"] == len(engine.tokenizer.apply_chat_template(MESSAGES))


async def test_the_allowance_counts_the_chat_templates_tokens(engine):
    prompt = len(engine.tokenizer.apply_chat_template(MESSAGES))  # far more than the message's 5 words
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 50, "ignore_eos": True}
    async with client(engine) as c:
        r = await c.post("/v1/chat/completions", json=body, headers={"X-Token-Allowance": str(prompt + 5)})
        refused = await c.post("/v1/chat/completions", json=body, headers={"X-Token-Allowance": str(prompt)})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == prompt and r.json()["usage"]["completion_tokens"] == 5
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "token_allowance_exceeded"
    assert refused.json()["error"]["message"].startswith(f"The prompt has {prompt} tokens; this request was allowed "
                                                         f"{prompt} tokens")
