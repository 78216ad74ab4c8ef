"""Speculative decoding's engine settings: plain, validated, errors name the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The flat keyword names LLM / AsyncLLM.from_args / the worker use, mapped to the fields below.
FLAT_KWARGS = {"speculative_ngram_tokens": "ngram_tokens", "speculative_max_running": "max_running",
               "prompt_lookup_min": "prompt_lookup_min", "prompt_lookup_max": "prompt_lookup_max"}


# A verify step computes 1 + k tokens for the request; past ~16 the chance that a whole n-gram run is
# still right is small and the step grows like a prefill chunk.
MAX_DRAFT_TOKENS = 16


@dataclass(slots=True)
class SpeculativeConfig:
    # Draft tokens proposed per decode step for requests that bring no `speculative_tokens` of their
    # own (0: off by default; a request may still opt in).
    ngram_tokens: int = 0
    # Proposals are made only while at most this many requests are running: a CPU step's time grows
    # with its tokens, so k drafts per request in a busy batch cost more than their accepted tokens save
    # (benchmarks/results/spec_decode.md measures where the line falls).
    max_running: int = 4
    prompt_lookup_min: int = 2  # the shortest suffix looked up earlier in the request's tokens
    prompt_lookup_max: int = 4  # the longest (tried first: a longer match predicts better)

    def __post_init__(self) -> None:
        if not isinstance(self.ngram_tokens, int) or not 0 <= self.ngram_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"speculative_ngram_tokens: must be an integer in [0, {MAX_DRAFT_TOKENS}], "
                             f"got {self.ngram_tokens!r}")
        if not isinstance(self.max_running, int) or self.max_running < 0:
            raise ValueError(f"speculative_max_running: must be an integer >= 0, got {self.max_running!r}")
        if not isinstance(self.prompt_lookup_min, int) or self.prompt_lookup_min < 1:
            raise ValueError(f"prompt_lookup_min: must be an integer >= 1, got {self.prompt_lookup_min!r}")
        if not isinstance(self.prompt_lookup_max, int) or self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max: must be an integer >= prompt_lookup_min "
                             f"({self.prompt_lookup_min}), got {self.prompt_lookup_max!r}")

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> SpeculativeConfig:
        """Build from the flat keyword arguments present in `kwargs`, removing them."""
        return cls(**{field: kwargs.pop(flat) for flat, field in FLAT_KWARGS.items() if flat in kwargs})

