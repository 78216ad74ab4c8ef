"""`POST /v1/embeddings` on the worker, over a real engine with a tiny random Llama (no weights to load).

Vectors are checked against transformers on the same tensors (tests/dataplane/test_embeddings.py's
oracle); both encodings, every input shape, and the 400s in OpenAI's error shape.
"""

from __future__ import annotations

import base64
import struct

import httpx
import pytest
import torch

from dataplane.config import CacheConfig, ModelConfig
from dataplane.engine.async_llm import AsyncLLM
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors
from tests.dataplane.test_embeddings import hf_model, oracle

HIDDEN = tiny_args().hidden_size


@pytest.fixture(scope="module")
def tiny():
    args = tiny_args()
    tensors = tiny_tensors(args, seed=5)
    return loaded(args, tensors), hf_model(args, tensors)


@pytest.fixture(scope="module", params=["last", "mean"])
def worker(request, tiny):
    engine = AsyncLLM(ModelConfig("tiny", dtype="float32"),
                      CacheConfig(block_size=4, kv_cache_memory="1MiB"), progress=False, preloaded=tiny[0])
    config = WorkerConfig(model="tiny", pooling=request.param, max_embedding_inputs=4)
    yield WorkerState(config, engine), request.param
    engine.shutdown()


def client(state: WorkerState) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")


def words(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)  # the tiny tokenizer: one word, one token


def decode_b64(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


@pytest.mark.parametrize("shape", ["string", "strings", "ids", "id_lists"])
async def test_every_input_shape_gives_the_pooled_vectors_in_both_encodings(worker, tiny, shape):
    state, pooling = worker
    prompts = [[5, 6, 7, 8, 9, 10, 11], [30, 31], list(range(40, 58))]
    if shape in ("string", "ids"):
        prompts = prompts[:1]
    body = {"string": words(prompts[0]), "strings": [words(p) for p in prompts], "ids": prompts[0],
            "id_lists": prompts}[shape]
    async with client(state) as c:
        as_float = await c.post("/v1/embeddings", json={"model": "tiny", "input": body, "user": "u-1"},
                                headers={"X-Request-Id": "emb-1"})
        as_b64 = await c.post("/v1/embeddings", json={"model": "tiny", "input": body, "encoding_format": "base64",
                                                      "dimensions": HIDDEN})
        remembered = (await c.get("/tessera/v1/requests/emb-1/usage")).json()
    if shape in ("string", "strings"):  # what the engine's tokenizer makes of the text (special tokens too)
        prompts = [state.engine.tokenizer.encode(words(p)) for p in prompts]
    assert as_float.status_code == 200, as_float.text
    assert as_b64.status_code == 200, as_b64.text
    got, b64 = as_float.json(), as_b64.json()
    tokens = sum(map(len, prompts))
    assert got["object"] == "list" and got["model"] == "tiny"
    assert got["usage"] == b64["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert (remembered["prompt_tokens"], remembered["completion_tokens"], remembered["status"]) == (tokens, 0, "ok")
    assert [d["index"] for d in got["data"]] == list(range(len(prompts)))
    for ids, item, packed in zip(prompts, got["data"], b64["data"], strict=True):
        assert item["object"] == "embedding" and len(item["embedding"]) == HIDDEN
        torch.testing.assert_close(torch.tensor(item["embedding"]), oracle(tiny[1], ids, pooling),
                                   atol=2e-5, rtol=1e-4)
        # The second request reads the first one's prefix from the cache: the same vector up to rounding.
        torch.testing.assert_close(torch.tensor(decode_b64(packed["embedding"])), torch.tensor(item["embedding"]),
                                   atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("body,param,code", [
    ({"input": ""}, "input", "invalid_value"),
    ({"input": []}, "input", "invalid_value"),
    ({"input": ["w1", ""]}, "input[1]", "invalid_value"),
    ({"input": [[3, 4], []]}, "input[1]", "invalid_value"),
    ({"input": list(range(1, 90)) * 3}, "input", "context_length_exceeded"),  # 267 tokens > 256
    ({"input": ["w1"] * 5}, "input", "too_many_inputs"),
    ({"input": [1, 2, 500]}, "input", "invalid_value"),  # outside the vocabulary
    ({"input": "w1", "dimensions": 8}, "dimensions", "unsupported_parameter"),
    ({"input": "w1", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ({"input": "w1", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens", "unsupported_parameter"),
    ({"input": 7}, "input", "invalid_type"),
])
async def test_bad_requests_are_400s_naming_the_field(worker, body, param, code):
    state, _ = worker
    async with client(state) as c:
        r = await c.post("/v1/embeddings", json={"model": "tiny", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code), err
    assert err["message"]


async def test_the_gateway_allowance_bounds_the_input_tokens(worker):
    state, _ = worker
    async with client(state) as c:
        refused = await c.post("/v1/embeddings", json={"input": [[1, 2, 3], [4, 5]]}, headers={"X-Token-Allowance": "4"})
        served = await c.post("/v1/embeddings", json={"input": [[1, 2, 3], [4, 5]]}, headers={"X-Token-Allowance": "5"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "token_allowance_exceeded"
    assert served.status_code == 200 and served.json()["usage"]["prompt_tokens"] == 5



async def test_the_inputs_count_toward_the_tenants_fair_share(tiny):
    engine = AsyncLLM(ModelConfig("tiny", dtype="float32"), CacheConfig(block_size=4, kv_cache_memory="1MiB"),
                      progress=False, preloaded=tiny[0])  # fresh counters
    try:
        async with client(WorkerState(WorkerConfig(model="tiny"), engine)) as c:
            r = await c.post("/v1/embeddings", json={"input": [[70, 71, 72], [73, 74]]},
                             headers={"X-Tenant-Id": "embedder", "X-Tenant-Weight": "2"})
        assert r.status_code == 200, r.text
        assert engine.core.scheduler.fair.counters == {"embedder": 5 / 2}  # prompt tokens x1, over the weight
    finally:
        engine.shutdown()


async def test_metrics_count_embedding_requests_by_outcome_their_tokens_and_durations(tiny):
    from prometheus_client.parser import text_string_to_metric_families

    engine = AsyncLLM(ModelConfig("tiny", dtype="float32"), CacheConfig(block_size=4, kv_cache_memory="1MiB"),
                      progress=False, preloaded=tiny[0])
    state = WorkerState(WorkerConfig(model="tiny", max_embedding_inputs=2), engine)  # fresh metrics
    try:
        async with client(state) as c:
            ok = [await c.post("/v1/embeddings", json={"input": [[5, 6, 7], [8, 9]]}, headers={"X-Priority": "3"}),
                  await c.post("/v1/embeddings", json={"input": "w1 w2 w3"})]
            refused = [await c.post("/v1/embeddings", json={"input": "w1", "dimensions": 8}),
                       await c.post("/v1/embeddings", json={"input": ["w1"] * 3})]
            generated = await c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2})
            scraped = (await c.get("/metrics")).text
    finally:
        engine.shutdown()
    assert [r.status_code for r in ok] == [200, 200] and [r.status_code for r in refused] == [400, 400]
    assert generated.status_code == 200, generated.text  # generation is not counted as an embedding
    tokens = sum(r.json()["usage"]["prompt_tokens"] for r in ok)
    assert tokens == 5 + len(engine.tokenizer.encode("w1 w2 w3"))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(scraped) for s in f.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"model_name": "tiny", **labels}.items())))]

    assert {status: value("tessera:embedding_requests_total", status=status)
            for status in ("ok", "rejected", "error", "cancelled")} == {"ok": 2, "rejected": 2, "error": 0,
                                                                         "cancelled": 0}
    assert value("tessera:embedding_prompt_tokens_total") == tokens
    for priority in ("3", "0"):
        assert value("tessera:embedding_request_duration_seconds_count", priority=priority) == 1
        assert value("tessera:embedding_request_duration_seconds_bucket", priority=priority, le="+Inf") == 1
        assert 0 < value("tessera:embedding_request_duration_seconds_sum", priority=priority) < 60
    assert value("tessera:e2e_request_latency_seconds_count", priority="0") == 1  # the completion only
