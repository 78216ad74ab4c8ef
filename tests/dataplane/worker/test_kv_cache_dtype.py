"""The worker's kv_cache_dtype: a flag (validated), passed to the engine, shown by /v1/models."""

from __future__ import annotations

import types

import httpx
import pytest

from dataplane.worker.config import load_config
from dataplane.worker.routes import WorkerState, create_app

from .fakes import FakeEngine


def test_the_flag_reaches_the_engine_and_bad_values_name_the_field():
    assert load_config(["--model", "x"], {}).engine_kwargs()["kv_cache_dtype"] == "auto"
    assert load_config(["--model", "x", "--kv-cache-dtype", "fp8"], {}).engine_kwargs()["kv_cache_dtype"] == "fp8"
    assert load_config(["--model", "x"], {"TESSERA_WORKER_KV_CACHE_DTYPE": "fp8"}).kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype: must be one of auto, fp8"):
        load_config(["--model", "x", "--kv-cache-dtype", "fp16"], {})


async def test_v1_models_shows_what_the_cache_holds():
    engine = FakeEngine()
    state = WorkerState(load_config(["--model", "fake", "--kv-cache-dtype", "fp8"], {}), engine)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")
    card = (await client.get("/v1/models")).json()["data"][0]
    assert card["kv_cache_dtype"] is None  # an engine that reports no memory (a stand-in)
    engine.core = types.SimpleNamespace(memory=types.SimpleNamespace(kv_cache_dtype="fp8"))
    assert (await client.get("/v1/models")).json()["data"][0]["kv_cache_dtype"] == "fp8"
