"""Embeddings: an embedding request's prompt pooled from the decoder's final hidden states.

As vLLM's pooling runner does for decoder-only models: the hidden states after the final norm
(what the lm head reads), pooled over the prompt and L2-normalized.
- `last`: the last prompt token's state, the only position a causal model has read the whole
  input at (the default: vLLM's for decoder embedders such as e5-mistral or Qwen3-Embedding);
- `mean`: the mean over every prompt position.

An embedding request is a prompt-only request (max_tokens 0) that the scheduler runs like any other,
under its priorities, token budget and ITL guard; chunked prefill included:
- `last` pools on the chunk that reaches the prompt's end. The KV manager always leaves the last
  token to compute, so a cached prefix changes nothing (its K/V are the ones the model would write).
- `mean` adds each chunk's rows to a running sum kept in the runner's request state and divides on
  the last chunk. Cached positions have no hidden states, so its prefix-cache lookup finds nothing
  (kv_cache/manager.py); its blocks are still published for others. A preemption drops the runner
  state with its sum, and the request recomputes from its first token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PoolSpan:
    request_id: str
    rows: range  # rows of the step's flattened batch that this request pools from
    last: bool  # the chunk reaches the prompt's end: the vector is complete


def pool_span(request_id: str, pooling: str, row0: int, start: int, n: int, num_prompt_tokens: int) -> PoolSpan | None:
    """What a request computing prompt positions [start, start + n) at batch row `row0` pools, if anything."""
    last = start + n >= num_prompt_tokens
    if pooling == "last":
        return PoolSpan(request_id, range(row0 + n - 1, row0 + n), True) if last else None
    return PoolSpan(request_id, range(row0, row0 + n), last)


@torch.inference_mode()
def pool(normed: torch.Tensor, spans: list[PoolSpan], sums: dict[str, torch.Tensor | None],
         num_prompt_tokens: dict[str, int]) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """`normed` holds the spans' rows in order (after the final norm). Returns the finished vectors, and
    the running sums of mean-pooled requests still mid-prompt (to keep in their runner state)."""
    vectors: dict[str, list[float]] = {}
    partial: dict[str, torch.Tensor] = {}
    row = 0
    for span in spans:
        part = normed[row : row + len(span.rows)].float()
        row += len(span.rows)
        rid = span.request_id
        if rid not in sums:  # last-token pooling: one row, on the last chunk
            vectors[rid] = F.normalize(part[-1], dim=-1).tolist()
            continue
        total = part.sum(dim=0) if sums[rid] is None else sums[rid] + part.sum(dim=0)
        if span.last:
            vectors[rid] = F.normalize(total / num_prompt_tokens[rid], dim=-1).tolist()
        else:
            partial[rid] = total
    return vectors, partial
