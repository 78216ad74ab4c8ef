"""Quality measures of a loaded model, through the engine's own forward (what serves is what is scored).

- ``perplexity``: exp of the mean next-token negative log-likelihood over a text, in windows of
  `window` tokens (each window a fresh prefill, so every variant sees the same contexts).
- ``greedy_agreement``: teacher-forced top-1 agreement with a reference continuation. The
  baseline's greedy continuation of each prompt is fed to the candidate, and at each position
  we check that the candidate's argmax is the baseline's token. Unlike comparing two free-running
  generations, one early difference does not make every later position differ.
"""

from __future__ import annotations

import math

import torch

from dataplane.models.llama import LlamaModel
from dataplane.models.loader import LoadedModel
from dataplane.runner.attention import AttentionMetadata, make_prefill_chunk

BLOCK_SIZE = 16


def prefill_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """float32 [len(ids), vocab]: the next-token logits after each prefix, from one prefill."""
    a, dev, n = model.args, model.device, len(ids)
    blocks = -(-n // BLOCK_SIZE)
    shape = (blocks, BLOCK_SIZE, a.num_kv_heads, a.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype, device=dev), torch.zeros(shape, dtype=model.dtype, device=dev))
              for _ in range(a.num_layers)]
    meta = AttentionMetadata(slot_mapping=torch.arange(n, device=dev), block_size=BLOCK_SIZE,
                             prefills=[make_prefill_chunk(0, n, 0, list(range(blocks)), dev)])
    positions = torch.arange(n, device=dev)
    return model.forward(torch.tensor(ids, device=dev), positions, meta, caches, positions).cpu()


def perplexity(model: LlamaModel, ids: list[int], window: int = 512) -> float:
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        logp = torch.log_softmax(prefill_logits(model, chunk[:-1]), dim=-1)
        target = torch.tensor(chunk[1:])
        nll -= float(logp[torch.arange(len(target)), target].sum())
        count += len(target)
    return math.exp(nll / count)


def greedy_continuations(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuations (EOS ignored, so every prompt yields `max_tokens`) from the engine."""
    from dataplane.engine.llm import LLM
    from dataplane.sampling_params import SamplingParams

    llm = LLM(str(loaded.path), preloaded=loaded, kv_cache_memory="64MiB", max_num_batched_tokens=1024)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(prompts, params)]


def greedy_agreement(model: LlamaModel, prompts: list[list[int]], references: list[list[int]]) -> float:
    """Fraction of positions where the model's argmax, given the reference so far, is the reference token."""
    hits = total = 0
    for prompt, ref in zip(prompts, references, strict=True):
        logits = prefill_logits(model, prompt + ref[:-1])[len(prompt) - 1 :]
        hits += int((logits.argmax(-1) == torch.tensor(ref)).sum())
        total += len(ref)
    return hits / max(total, 1)
