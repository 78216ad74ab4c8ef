"""X-Tenant-Id and X-Tenant-Weight reach the engine's fair-share counters (a real engine, tiny random model)."""

from __future__ import annotations

import httpx
import pytest

from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.async_llm import AsyncLLM
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors

PROMPT = [5, 6, 7, 8, 9]
BODY = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "ignore_eos": True, "temperature": 0}


@pytest.fixture
async def worker():
    args = tiny_args()
    engine = AsyncLLM(ModelConfig(model="tiny", dtype="float32"), CacheConfig(block_size=4, kv_cache_memory="1MiB"),
                      SchedulerConfig(max_num_batched_tokens=16), progress=False,
                      preloaded=loaded(args, tiny_tensors(args, seed=1)))
    state = WorkerState(WorkerConfig(model="tiny"), engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w") as client:
        yield engine, client
    engine.shutdown()


async def test_the_engine_charges_the_named_tenant_by_its_weight(worker):
    engine, client = worker
    headers = {"X-Tenant-Id": "acme", "X-Tenant-Weight": "2", "X-Cache-Salt": "salt-acme"}
    r = await client.post("/v1/completions", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    fair = engine.core.scheduler.fair
    # prompt tokens x1 + generated tokens x2, over the weight; the salt is not the key
    assert fair.counters == {"acme": (len(PROMPT) * 1 + 3 * 2) / 2}

    r = await client.post("/v1/completions", json=BODY)  # no tenant: the anonymous bucket, weight 1
    assert r.status_code == 200, r.text
    assert fair.counter(None) > 0 and "salt-acme" not in fair.counters


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e9", "two"])
async def test_a_bad_weight_header_is_a_400_naming_it(worker, bad):
    _, client = worker
    r = await client.post("/v1/completions", json=BODY, headers={"X-Tenant-Id": "acme", "X-Tenant-Weight": bad})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_header" and "x-tenant-weight" in r.json()["error"]["message"]


def test_the_offline_api_names_tenants_per_prompt():
    from dataplane import LLM, SamplingParams

    args = tiny_args()
    llm = LLM("tiny", dtype="float32", preloaded=loaded(args, tiny_tensors(args, seed=1)), block_size=4,
              kv_cache_memory="1MiB")
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    llm.generate([PROMPT, PROMPT[:3]], params, tenants=["a", "b"])
    assert set(llm.core.scheduler.fair.counters) == llm.core.scheduler.fair.active == {"a", "b"}
    with pytest.raises(ValueError, match="tenants"):
        llm.generate([PROMPT], params, tenants=["a", "b"])
