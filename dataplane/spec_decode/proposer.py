"""Which requests speculate this step, and how many draft tokens they may take."""

from __future__ import annotations

from dataplane.request import Request
from dataplane.spec_decode.config import SpeculativeConfig
from dataplane.spec_decode.ngram import propose_ngram


def draft_tokens(req: Request, budget: int, max_model_len: int, config: SpeculativeConfig) -> list[int]:
    """n-gram drafts for a request about to decode one token; [] when it does not speculate.

    Not for structured outputs: each draft row would need the grammar advanced over the drafts before it
    and rolled back after a rejection; those requests decode one token a step. Drafts never run past
    max_tokens or the context, and always leave the decode itself within the step's token budget."""
    if req.num_tokens - req.num_computed_tokens != 1:
        return []  # a prefill chunk (or a recompute after preemption): nothing to verify against yet
    p = req.sampling_params
    k = config.ngram_tokens if p.speculative_tokens is None else p.speculative_tokens
    if not k or p.structured is not None or not p.max_tokens:
        return []
    k = min(k, budget - 1, p.max_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens)
    if k <= 0:
        return []
    return propose_ngram(req.all_token_ids, k, config.prompt_lookup_min, config.prompt_lookup_max)
