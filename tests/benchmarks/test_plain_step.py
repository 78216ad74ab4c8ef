"""benchmarks/plain_step.py: the reference step is a correct Llama decode step, not a cost model.

Decoded token by token from the same weights, it gives the engine's greedy tokens and logprobs (the
engine's CPU path: interleaved rotary, paged attention), so the GPU check's reference column measures
the work the engine's step does. Its timing runs eagerly here; the CUDA graph replay needs a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.plain_step import PlainLlama, measure
from dataplane import LLM, SamplingParams
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors

PROMPT = [5, 17, 3, 44, 9, 60, 21]
NEW = 12


@pytest.mark.parametrize("tied", [False, True])
def test_token_by_token_it_gives_the_engines_tokens_and_logprobs(tied):
    args = dataclasses.replace(tiny_args(tied=tied), rope_theta=500.0)  # a fast turn: positions matter a lot
    tensors = tiny_tensors(args, seed=3)
    llm = LLM("tiny", dtype="float32", preloaded=loaded(args, tensors), block_size=4, max_num_seqs=4,
              max_num_batched_tokens=64, kv_cache_memory="1MiB")
    out = llm.generate([PROMPT], SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True, logprobs=2))[0]
    engine = out.outputs[0]
    assert len(engine.token_ids) == NEW

    ref = PlainLlama.from_hf(args, tensors, torch.float32, "cpu")
    k_cache, v_cache = ref.cache(1, len(PROMPT) + NEW)
    fed = PROMPT + engine.token_ids[:-1]
    with torch.inference_mode():
        for pos, tok in enumerate(fed):
            logits = ref.step(torch.tensor([tok]), pos, ref.rotation(pos), k_cache, v_cache)[0]
            i = pos - (len(PROMPT) - 1)
            if i < 0:
                continue
            logprobs = torch.log_softmax(logits.double(), -1)
            want = engine.logprobs[i]
            assert int(logits.argmax()) == engine.token_ids[i] == want.token_id, (pos, i)
            assert float(logprobs[want.token_id]) == pytest.approx(want.logprob, abs=1e-4)
            for alt, lp in want.top:
                assert float(logprobs[alt]) == pytest.approx(lp, abs=1e-4)


def test_rotation_turns_pairs_as_rotate_half_does():
    ref = PlainLlama.random(tiny_args(), torch.float64, "cpu")
    d = ref.args.head_dim
    x = torch.randn(3, d, dtype=torch.float64)
    pos = 11
    inv_freq = 1.0 / (ref.args.rope_theta ** (torch.arange(0, d, 2).double() / d))
    cos, sin = (pos * inv_freq).cos().repeat(2), (pos * inv_freq).sin().repeat(2)
    rotate_half = torch.cat([-x[:, d // 2:], x[:, : d // 2]], dim=-1)
    assert torch.allclose(x @ ref.rotation(pos), x * cos + rotate_half * sin, atol=1e-12)
    assert torch.allclose(ref.rotation(0), torch.eye(d, dtype=torch.float64))


def test_measure_eager_on_the_cpu_and_graphs_need_cuda():
    ref = PlainLlama.random(tiny_args(), torch.float32, "cpu")
    row = measure(ref, 4, 16, graph=False, iters=3, warmup=1)
    assert row["batch"] == 4 and row["ctx"] == 16 and row["ms"] > 0
    assert row["tok_s"] == pytest.approx(4 / (row["ms"] / 1000))
    with pytest.raises(ValueError, match="CUDA graph needs a CUDA device"):
        measure(ref, 4, 16, graph=True)
