"""The second tier through a real worker process: the flags, conversations the KV cache cannot hold coming
back from the tier (the official client, greedy, the same text as the first time), and its metrics."""

from __future__ import annotations

import openai
import pytest

from dataplane.worker.config import load_config

from .process import MODEL, TOKEN, WorkerProcess

HISTORIES = [f"Notes on {topic}. " + f"Everything we know about {topic} is written here. " * 10
             for topic in ("tides", "glaciers", "volcanoes")]


def test_the_flags_reach_the_engine_and_bad_values_name_the_field(tmp_path):
    cfg = load_config(["--model", "x", "--kv-offload-size", "2GiB", "--kv-offload-dir", str(tmp_path)], {})
    assert cfg.engine_kwargs()["kv_offload_size"] == "2GiB"
    assert cfg.engine_kwargs()["kv_offload_dir"] == str(tmp_path)
    assert load_config(["--model", "x"], {"TESSERA_WORKER_KV_OFFLOAD_SIZE": "1GiB"}).kv_offload_size == "1GiB"
    assert load_config(["--model", "x"], {}).engine_kwargs()["kv_offload_size"] == "0"
    with pytest.raises(ValueError, match="kv_offload_size"):
        load_config(["--model", "x", "--kv-offload-size", "lots"], {})
    with pytest.raises(ValueError, match="kv_offload_dir: set kv_offload_size"):
        load_config(["--model", "x", "--kv-offload-dir", str(tmp_path)], {})
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        load_config(["--model", "x", "--kv-offload-size", "1GiB", "--no-enable-prefix-caching"], {})


@pytest.mark.slow
@pytest.mark.model
def test_conversations_the_cache_cannot_hold_come_back_from_the_tier(tmp_path):
    # 12 float32 blocks of 16 tokens (192 tokens): the three ~110-token histories evict one another. float32:
    # greedy text from cached K/V equals a recompute's (in bf16 the different sums can move a later token).
    w = WorkerProcess("--dtype", "float32", "--kv-cache-memory", str(12 * 16 * 2 * 30 * 3 * 64 * 4),
                      "--kv-offload-size", "64MiB",
                      "--kv-offload-dir", str(tmp_path), "--no-load-curve")
    try:
        w.wait_ready()
        client = openai.OpenAI(base_url=w.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
        texts = []
        for _ in range(2):
            for history in HISTORIES:
                out = client.completions.create(model=MODEL, prompt=history, max_tokens=8, temperature=0)
                texts.append(out.choices[0].text)
        assert texts[:3] == texts[3:]
        m = w.metrics()
        assert m["tessera:kv_offload_loaded_blocks_total"] >= 3 * 5  # each history's blocks came back
        assert m["tessera:kv_offload_saved_blocks_total"] >= m["tessera:kv_offload_loaded_blocks_total"]
        assert m["tessera:kv_offload_failed_loads_total"] == 0
        assert m["tessera:kv_offload_capacity_bytes"] == 64 * 2**20
        assert m["tessera:prefix_cache_hits_total"] >= 16 * m["tessera:kv_offload_loaded_blocks_total"]
        assert list(tmp_path.glob("*.kv"))
    finally:
        w.stop()
    assert not list(tmp_path.glob("*.tmp"))
