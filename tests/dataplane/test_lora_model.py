"""Multi-LoRA on the real SmolLM2 weights, against peft's own merge and transformers, in float32.

Adapters are made with peft on transformers' LlamaForCausalLM (the same GGUF weights), with random
non-zero A and B (peft initialises B to zero), varied ranks, targets, alphas and one rsLoRA, and
saved with save_pretrained. The oracle for an adapter is peft's merge_and_unload of it into a copy
of the base model, generating greedily with transformers, one prompt at a time.
"""

from __future__ import annotations

import asyncio
import copy
import gc

import pytest
import torch

from dataplane import LLM, SamplingParams
from dataplane.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from dataplane.engine.async_llm import AsyncLLM
from tests.dataplane.conftest import MODEL, PROMPTS, hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.model]

MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
KV = "128MiB"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPECS = {  # name: (rank, alpha, targets, use_rslora)
    "alpha": (8, 16, ALL, False),
    "bravo": (4, 8, ["q_proj", "v_proj"], True),
    "charlie": (16, 64, ["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
}
# A mixed batch: adapters, the base model, repeats; short and long prompts (PROMPTS[4] is ~200 tokens).
# PROMPTS[4] and [7] are so repetitive that no adapter here changes their greedy continuation.
BATCH = [(0, "alpha"), (1, "bravo"), (2, None), (3, "alpha"), (4, "charlie"), (5, "bravo"), (6, "charlie"),
         (7, None)]


def _make_adapter(hf, path, rank, alpha, targets, rslora, seed):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(hf), LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                                         use_rslora=rslora, lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.save_pretrained(str(path))
    return model.merge_and_unload().eval()  # peft's own merge: W + scaling * B A


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, hf_reference, smollm_fp32):
    """name -> adapter dir, and the oracle's greedy tokens for every (prompt, adapter) of BATCH."""
    root = tmp_path_factory.mktemp("adapters")
    ids = [smollm_fp32.tokenizer.encode(p) for p in PROMPTS]
    expected = {}
    for seed, (name, (rank, alpha, targets, rslora)) in enumerate(SPECS.items()):
        merged = _make_adapter(hf_reference, root / name, rank, alpha, targets, rslora, seed)
        for i, adapter in BATCH:
            if adapter == name:
                expected[i] = hf_greedy(merged, ids[i], MAX_TOKENS)
        del merged
        gc.collect()
    for i, adapter in BATCH:
        if adapter is None:
            expected[i] = hf_greedy(hf_reference, ids[i], MAX_TOKENS)
    return {name: str(root / name) for name in SPECS}, ids, expected


def _llm(loaded, dirs, **kw):
    llm = LLM(MODEL, dtype="float32", preloaded=loaded, kv_cache_memory=KV, enable_lora=True, max_lora_rank=16, **kw)
    for name, path in dirs.items():
        llm.add_adapter(name, path)
    return llm


def _run_batch(llm, ids):
    outs = llm.generate([ids[i] for i, _ in BATCH], GREEDY, adapters=[a for _, a in BATCH])
    return {i: o.token_ids for (i, _), o in zip(BATCH, outs, strict=True)}


@pytest.fixture(scope="module")
def mixed_outputs(smollm_fp32, adapters):
    dirs, ids, _ = adapters
    llm = _llm(smollm_fp32, dirs, max_loras=3, max_num_batched_tokens=256)
    out = _run_batch(llm, ids)
    assert llm.core.stats().num_free_blocks == llm.core.memory.num_blocks
    return out


def test_mixed_batch_equals_merged_adapters(adapters, mixed_outputs, smollm_fp32):
    _, ids, expected = adapters
    for i, adapter in BATCH:
        assert mixed_outputs[i] == expected[i], f"prompt {i} with adapter {adapter} diverged from the merged model"
    # Each adapter changes what the model says (else the comparison above proves little).
    base = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=KV).generate([ids[i] for i, _ in BATCH], GREEDY)
    for name in SPECS:
        assert any(mixed_outputs[i] != base[k].token_ids for k, (i, a) in enumerate(BATCH) if a == name), name


def test_slot_eviction_and_reload_give_identical_outputs(smollm_fp32, adapters, mixed_outputs):
    dirs, ids, _ = adapters
    llm = _llm(smollm_fp32, dirs, max_loras=1)
    short = [(i, a) for i, a in BATCH if len(ids[i]) < 64]  # the short prompts of every adapter
    assert {a for _, a in short} == {*SPECS, None}
    outs = llm.generate([ids[i] for i, _ in short], GREEDY, adapters=[a for _, a in short])
    # One slot: the adapters take turns, each evicting the one before.
    assert [o.token_ids for o in outs] == [mixed_outputs[i] for i, _ in short]
    slots = llm.core.runner.lora.slots
    assert slots.num_evictions >= 2 and slots.keys[0] != llm.core.lora.registry.get("alpha").key
    loads = slots.num_loads
    # alpha comes back into the slot another adapter (other rank, other targets) used.
    again = llm.generate([ids[0], ids[3]], GREEDY, adapters=["alpha", "alpha"])
    assert [o.token_ids for o in again] == [mixed_outputs[0], mixed_outputs[3]]
    assert slots.num_loads == loads + 1


def test_prefix_cache_is_keyed_by_adapter(smollm_fp32, adapters, mixed_outputs):
    dirs, ids, _ = adapters
    llm = _llm(smollm_fp32, dirs, max_loras=2)
    prompt = ids[4]  # long enough for many full blocks

    def run(adapter, max_tokens=1):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        out = llm.generate([prompt], params, adapters=[adapter])[0]
        return out.num_cached_tokens, out.token_ids

    cached, first = run("charlie", MAX_TOKENS)
    assert cached == 0 and first == mixed_outputs[4]
    assert run(None)[0] == 0 and run("alpha")[0] == 0 and run("bravo")[0] == 0  # no sharing across adapters
    cached, again = run("charlie", MAX_TOKENS)
    assert cached > 0 and again == first
    # Re-adding a name with other weights must not meet the old weights' blocks.
    alpha_first = run("alpha", 3)[1]
    llm.remove_adapter("charlie")
    llm.add_adapter("charlie", dirs["alpha"])
    cached, swapped = run("charlie", 3)
    assert cached == 0 and swapped == alpha_first


def test_adapter_api_errors_and_the_engine_keeps_serving(smollm_fp32, adapters, mixed_outputs, tmp_path):
    dirs, ids, _ = adapters
    llm = _llm(smollm_fp32, {"alpha": dirs["alpha"]}, max_loras=2)
    with pytest.raises(ValueError, match="^adapter: unknown adapter 'nope'"):
        llm.generate([ids[0]], GREEDY, adapters=["nope"])
    with pytest.raises(ValueError, match="^adapters: got 2 values for 1 prompts"):
        llm.generate([ids[0]], GREEDY, adapters=["alpha", None])
    small = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=KV, enable_lora=True, max_lora_rank=8)
    with pytest.raises(ValueError, match="^adapter 'charlie': rank 16 .*exceeds max_lora_rank=8"):
        small.add_adapter("charlie", dirs["charlie"])
    with pytest.raises(ValueError, match="adapter_config.json is missing"):
        llm.add_adapter("ghost", str(tmp_path))
    with pytest.raises(ValueError, match="^adapter: LoRA is not enabled"):
        LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=KV).generate([ids[0]], GREEDY,
                                                                                       adapters=["alpha"])
    # In use: a queued request holds the adapter.
    core = llm.core
    core.add(*core.make_requests(ids[0], GREEDY, adapter="alpha"))
    with pytest.raises(ValueError, match="in use"):
        llm.remove_adapter("alpha")
    while core.has_unfinished():
        core.step()
    assert llm.generate([ids[0]], GREEDY, adapters=["alpha"])[0].token_ids == mixed_outputs[0]
    llm.remove_adapter("alpha")
    assert llm.list_adapters() == []
    with pytest.raises(ValueError, match="unknown adapter 'alpha'"):
        llm.generate([ids[0]], GREEDY, adapters=["alpha"])


def test_async_llm_adapters(smollm_fp32, adapters, mixed_outputs):
    dirs, ids, _ = adapters

    async def main():
        engine = AsyncLLM(ModelConfig(MODEL, dtype="float32"), CacheConfig(kv_cache_memory=KV),
                          SchedulerConfig(), progress=False, preloaded=smollm_fp32,
                          lora_config=LoRAConfig(max_loras=2, max_lora_rank=16))
        try:
            async def collect(i, adapter):
                tokens = []
                async for out in engine.generate(ids[i], GREEDY, adapter=adapter):
                    tokens += out.outputs[0].token_ids
                return tokens

            await engine.add_adapter("alpha", dirs["alpha"])
            running = asyncio.ensure_future(collect(0, "alpha"))
            await engine.add_adapter("bravo", dirs["bravo"])  # parsed while the engine decodes
            results = await asyncio.gather(running, collect(1, "bravo"), collect(2, None))
            assert results == [mixed_outputs[0], mixed_outputs[1], mixed_outputs[2]]
            assert [a.name for a in await engine.list_adapters()] == ["alpha", "bravo"]
            assert engine.latest_lora_stats is not None and engine.latest_lora_stats.loaded == ["alpha", "bravo"]
            with pytest.raises(ValueError, match="^adapter: unknown adapter 'zulu'"):
                async for _ in engine.generate(ids[0], GREEDY, adapter="zulu"):
                    pass
            with pytest.raises(ValueError, match="rank 16 exceeds|already loaded"):
                await engine.add_adapter("alpha", dirs["charlie"])
            await engine.remove_adapter("alpha")
            assert [a.name for a in await engine.list_adapters()] == ["bravo"]
            with pytest.raises(ValueError, match="unknown adapter 'alpha'"):
                await engine.remove_adapter("alpha")
            assert engine.is_alive()
        finally:
            engine.shutdown()

    asyncio.run(main())
