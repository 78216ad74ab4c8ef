"""Embeddings through the engine (runner/pooling.py) on a tiny random Llama, against transformers.

The oracle is transformers' LlamaModel on the same tensors: its last_hidden_state is after the final
norm, pooled (last token or mean) and L2-normalized in plain torch, one prompt at a time.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dataplane import LLM, SamplingParams
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors

# Lengths around the block size (4) and the step budget (8 tokens): several prompts are chunked.
PROMPTS = [[5], [7, 8, 9], list(range(10, 14)), list(range(20, 37)), list(range(3, 30, 2)), [11] * 23]
SHARED = list(range(40, 60))  # a 20-token prefix (5 blocks) that later prompts reuse from the cache


@pytest.fixture(scope="module")
def tiny():
    args = tiny_args()
    tensors = tiny_tensors(args, seed=3)
    return loaded(args, tensors), hf_model(args, tensors)


def hf_model(args, tensors):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                         intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
                         num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
                         head_dim=args.head_dim, rms_norm_eps=args.rms_norm_eps, rope_theta=args.rope_theta,
                         max_position_embeddings=args.max_position)
    model = LlamaModel(config).eval()
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")})
    return model


def oracle(model, ids: list[int], pooling: str) -> torch.Tensor:
    with torch.inference_mode():
        h = model(torch.tensor([ids])).last_hidden_state[0]
    return F.normalize(h[-1] if pooling == "last" else h.mean(dim=0), dim=-1)


def engine(tiny, **kw) -> LLM:
    options = {"block_size": 4, "max_num_batched_tokens": 8, "kv_cache_memory": "1MiB", **kw}
    return LLM("tiny", dtype="float32", preloaded=tiny[0], **options)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_pooled_vectors_match_transformers_batched_and_one_at_a_time(tiny, pooling):
    llm = engine(tiny)
    batched = llm.embed(PROMPTS, pooling=pooling)
    alone = [llm.embed([p], pooling=pooling)[0] for p in PROMPTS]
    for ids, got, single in zip(PROMPTS, batched, alone, strict=True):
        want = oracle(tiny[1], ids, pooling)
        assert len(got) == tiny[0].args.hidden_size
        torch.testing.assert_close(torch.tensor(got), want, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(single), atol=1e-6, rtol=1e-5)
        assert abs(torch.tensor(got).norm().item() - 1.0) < 1e-5


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_prefix_cache_on_or_off_gives_the_same_vectors(tiny, pooling):
    prompts = [SHARED + [1, 2, 3], SHARED + [4], SHARED + list(range(60, 70))]
    cold = engine(tiny, enable_prefix_caching=False).embed(prompts, pooling=pooling)
    cached = engine(tiny)
    cached.embed([SHARED + [9]], pooling=pooling)  # publishes the shared blocks
    outs = cached.generate(prompts, SamplingParams(max_tokens=0, pooling=pooling))
    hits = [o.num_cached_tokens for o in outs]
    # last-token pooling reads the cache (the last token is always computed); mean pooling cannot.
    assert hits == ([len(SHARED)] * 3 if pooling == "last" else [0, 0, 0])
    for out, want, ids in zip(outs, cold, prompts, strict=True):
        torch.testing.assert_close(torch.tensor(out.embedding), torch.tensor(want), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(out.embedding), oracle(tiny[1], ids, pooling), atol=2e-5, rtol=1e-4)
        assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"


def test_embeddings_share_steps_with_generation_without_changing_it(tiny):
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    alone = engine(tiny).generate([PROMPTS[3]], greedy)[0].token_ids
    llm = engine(tiny, max_num_batched_tokens=16)
    mixed = llm.generate([PROMPTS[3], PROMPTS[4], PROMPTS[5]],
                         [greedy, SamplingParams(max_tokens=0, pooling="mean"),
                          SamplingParams(max_tokens=0, pooling="last")])
    assert mixed[0].token_ids == alone and mixed[0].embedding is None
    torch.testing.assert_close(torch.tensor(mixed[1].embedding), oracle(tiny[1], PROMPTS[4], "mean"),
                               atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(mixed[2].embedding), oracle(tiny[1], PROMPTS[5], "last"),
                               atol=2e-5, rtol=1e-4)
    assert not llm.core.has_unfinished() and llm.core.scheduler.kv.pool.num_free == llm.core.scheduler.kv.num_blocks


@pytest.mark.parametrize("kw,field", [
    ({"max_tokens": 0, "pooling": "max"}, "pooling"),
    ({"max_tokens": 3, "pooling": "last"}, "pooling"),
    ({"max_tokens": 0, "pooling": "mean", "prompt_logprobs": 1}, "pooling"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_pooling_parameters_are_refused_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kw)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_a_preempted_embedding_recomputes_to_the_same_vector(tiny, pooling):
    """One seat: an urgent request arriving while a long input is mid-prompt preempts it; the input
    starts over (the mean's running sum is dropped with the runner state) and ends on the same vector."""
    llm = engine(tiny, max_num_seqs=1)
    core = llm.core
    rid, text, children = core.make_requests(PROMPTS[5], SamplingParams(max_tokens=0, pooling=pooling), priority=5)
    core.add(rid, text, children)
    core.step()  # its first 8-token chunk
    assert 0 < children[0].num_computed_tokens < len(PROMPTS[5])
    urgent = core.make_requests([9, 10], SamplingParams(max_tokens=2, temperature=0.0), priority=0)
    core.add(*urgent)
    outputs = []
    while core.has_unfinished():
        outputs += core.step()
    assert children[0].num_preemptions == 1
    vector = next(o.embedding for o in outputs if o.request_id == rid)
    torch.testing.assert_close(torch.tensor(vector), oracle(tiny[1], PROMPTS[5], pooling), atol=2e-5, rtol=1e-4)
