"""The compiled decode path (models/compiled_decode.py) on a tiny random Llama: same greedy tokens as
eager, and a compiler failure turns it off cleanly, the step then running eager."""

from __future__ import annotations

import pytest

from dataplane import LLM, SamplingParams
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors

PROMPTS = [list(range(5, 14)), list(range(30, 47)), [11] * 6]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _generate(model, prompts):
    llm = LLM("tiny", dtype="float32", preloaded=model, block_size=4, kv_cache_memory="1MiB",
              max_num_batched_tokens=32)
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.mark.slow  # two Inductor compiles of the tiny model: ~15 s idle, ~55 s on a loaded 2-core host
def test_compiled_decode_gives_eager_tokens_at_batch_1_and_3():
    model = loaded(tiny_args(), tiny_tensors(tiny_args(), seed=5))
    eager_alone = [_generate(model, [p])[0] for p in PROMPTS]
    eager_batch = _generate(model, PROMPTS)
    assert model.model.enable_compiled_decode()
    compiled = model.model.compiled
    try:
        assert [_generate(model, [p])[0] for p in PROMPTS] == eager_alone
        assert _generate(model, PROMPTS) == eager_batch
        assert compiled.failed is None
        assert compiled.calls >= 3 * 11  # every decode step of the three requests ran compiled
        assert 1 in compiled.compile_seconds
    finally:
        compiled.release()


def test_compile_failure_falls_back_to_eager(monkeypatch, caplog):
    model = loaded(tiny_args(), tiny_tensors(tiny_args(), seed=6))
    want = _generate(model, PROMPTS)
    assert model.model.enable_compiled_decode()
    compiled = model.model.compiled

    def broken(*_args):
        raise RuntimeError("inductor: no C++ compiler here")

    monkeypatch.setattr(compiled, "_compiled", broken)
    with caplog.at_level("WARNING"):
        assert _generate(model, PROMPTS) == want
    assert compiled.failed == "RuntimeError: inductor: no C++ compiler here"
    assert compiled.calls == 0 and "compiled decode turned off" in caplog.text
    assert not compiled.applies(None, None)  # off for good: later steps do not try again


def test_engine_flag_enables_it_lazily():
    from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
    from dataplane.engine.core import EngineCore

    model = loaded(tiny_args(), tiny_tensors(tiny_args()))
    EngineCore(ModelConfig("tiny", dtype="float32"), CacheConfig(4, "1MiB"), SchedulerConfig(), progress=False,
               preloaded=model)
    assert model.model.compiled is None  # off by default
    EngineCore(ModelConfig("tiny", dtype="float32", compile_decode=True), CacheConfig(4, "1MiB"), SchedulerConfig(),
               progress=False, preloaded=model)
    assert model.model.compiled is not None and model.model.compiled.compile_seconds == {}  # nothing compiled yet
    model.model.compiled.release()


def test_not_enabled_where_the_kernels_run():
    model = loaded(tiny_args(), tiny_tensors(tiny_args()))
    model.model.use_kernels = True
    assert not model.model.enable_compiled_decode() and model.model.compiled is None


def test_the_worker_flag_reaches_the_engine_in_both_ways_a_worker_loads():
    from dataplane.worker.agent.slot import MODEL_CONFIG
    from dataplane.worker.config import load_config

    assert load_config(["--model", "m"], env={}).engine_kwargs()["compile_decode"] is False
    kwargs = load_config(["--model", "m", "--compile-decode"], env={}).engine_kwargs()
    assert kwargs["compile_decode"] is True
    assert load_config(["--model", "m"], env={"TESSERA_WORKER_COMPILE_DECODE": "true"}).engine_kwargs()["compile_decode"]
    assert "compile_decode" in MODEL_CONFIG  # a replica loaded by the agent builds its ModelConfig from these keys
