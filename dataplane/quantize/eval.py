"""Quality measures of a loaded model, through the engine's own forward (what serves is what is scored).

- ``perplexity``: exp of the mean next-token negative log-likelihood over a text, in windows of
  `window` tokens (each window a fresh prefill, so every variant sees the same contexts).
- ``greedy_agreement``: teacher-forced top-1 agreement with a reference continuation. The
  baseline's greedy continuation of each prompt is fed to the candidate, and at each position
  we check that the candidate's argmax is the baseline's token. Unlike comparing two free-running
  generations, one early difference does not make every later position differ.

Each takes the KV cache's dtype (`kv_cache_dtype="fp8"`: kernels/kv_fp8.py), so the same measures score
an FP8 cache against the model's own (dataplane/quantize/gate.py's kv_fp8 gate). A prefill reads its
K/V back rounded through FP8 as decodes read the cache (models/attention.py), so a prefill's logits are
what a decode over that cache would see.
"""

from __future__ import annotations

import math

import torch

from dataplane.engine.llm import LLM
from dataplane.models.attention import AttentionMetadata, allocate_kv_cache, make_prefill_chunk
from dataplane.models.llama import LlamaModel
from dataplane.models.loader import LoadedModel
from dataplane.sampling_params import SamplingParams

BLOCK_SIZE = 16


def prefill_logits(model: LlamaModel, ids: list[int], kv_cache_dtype: str = "auto") -> torch.Tensor:
    """float32 [len(ids), vocab]: the next-token logits after each prefix, from one prefill."""
    a, dev, n = model.args, model.device, len(ids)
    blocks = -(-n // BLOCK_SIZE)
    layer = (blocks, BLOCK_SIZE, a.num_kv_heads, a.head_dim, model.dtype, dev, kv_cache_dtype)
    caches = [(allocate_kv_cache(*layer), allocate_kv_cache(*layer)) for _ in range(a.num_layers)]
    meta = AttentionMetadata(slot_mapping=torch.arange(n, device=dev), block_size=BLOCK_SIZE,
                             prefills=[make_prefill_chunk(0, n, 0, list(range(blocks)), dev)])
    positions = torch.arange(n, device=dev)
    return model.forward(torch.tensor(ids, device=dev), positions, meta, caches, positions).cpu()


def token_logprobs(model: LlamaModel, ids: list[int], window: int = 512, kv_cache_dtype: str = "auto") -> torch.Tensor:
    """float32 [len(ids) - 1]: each next token's log-probability, in windows of `window` tokens."""
    out = []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        logp = torch.log_softmax(prefill_logits(model, chunk[:-1], kv_cache_dtype), dim=-1)
        out.append(logp[torch.arange(len(chunk) - 1), torch.tensor(chunk[1:])])
    return torch.cat(out)


def perplexity(model: LlamaModel, ids: list[int], window: int = 512, kv_cache_dtype: str = "auto") -> float:
    return perplexity_of(token_logprobs(model, ids, window, kv_cache_dtype))


def perplexity_of(logprobs: torch.Tensor) -> float:
    return math.exp(-float(logprobs.double().mean()))


def greedy_continuations(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuations (EOS ignored, so every prompt yields `max_tokens`) from the engine."""
    llm = LLM(str(loaded.path), preloaded=loaded, kv_cache_memory="64MiB", max_num_batched_tokens=1024)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(prompts, params)]


def greedy_agreement(model: LlamaModel, prompts: list[list[int]], references: list[list[int]],
                     kv_cache_dtype: str = "auto") -> float:
    """Fraction of positions where the model's argmax, given the reference so far, is the reference token."""
    hits = total = 0
    for prompt, ref in zip(prompts, references, strict=True):
        logits = prefill_logits(model, prompt + ref[:-1], kv_cache_dtype)[len(prompt) - 1 :]
        hits += int((logits.argmax(-1) == torch.tensor(ref)).sum())
        total += len(ref)
    return hits / max(total, 1)
