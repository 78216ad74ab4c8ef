"""What the scheduler hands the model runner each step, and what comes back. Plain data only."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen (first schedule, or resumed after preemption)."""

    request_id: str
    token_ids: list[int]  # every known token: prompt, plus outputs for a resumed request
    num_prompt_tokens: int  # leading prompt tokens in token_ids (penalties count outputs apart)
    block_ids: list[int]  # the whole block table so far
    num_computed_tokens: int  # tokens already in the cache (prefix-cache hits)
    sampling_params: SamplingParams
    adapter: str | None  # LoRA adapter name, None for the base model


@dataclass(slots=True)
class CachedRequestData:
    """A request the runner already holds; only what changed since its last step."""

    request_id: str
    new_block_ids: list[int]  # blocks appended to its table this step
    num_computed_tokens: int  # tokens in the cache before this step


@dataclass(slots=True)
class SchedulerOutput:
    new_requests: list[NewRequestData] = field(default_factory=list)  # first-time or resumed requests
    cached_requests: list[CachedRequestData] = field(default_factory=list)  # continuing requests
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # tokens to compute per request
    total_num_scheduled_tokens: int = 0  # sum of the above, within max_num_batched_tokens
    finished_request_ids: set[str] = field(default_factory=set)  # runner drops these (finished/preempted)
    preempted_request_ids: list[str] = field(default_factory=list)  # preempted this step (recompute later)
    # Decoding requests that speculate: their n-gram draft tokens, computed after their last known token
    # (num_scheduled_tokens counts 1 + drafts) and verified against the model's own choices (spec_decode/)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Overlapped scheduling: Scheduler.advance counted this step's tokens as computed at launch, so its
    # update only adds what it sampled (and takes back rejected drafts).
    advanced: bool = False
    pending: set[str] = field(default_factory=set)  # requests whose sample this step advance() marked pending
    starts: dict[str, int] = field(default_factory=dict)  # advance(): each request's computed tokens before it
    # The prefix cache's second tier (kv_cache/second_tier.py), applied by the runner before the forward, saves
    # first: (block id, hash) of cached blocks handed to new owners this step, whose bytes go to the tier;
    # {block id: payload} of blocks found in the tier, whose bytes come back into the cache.
    kv_saves: list[tuple[int, bytes]] = field(default_factory=list)
    kv_loads: dict[int, bytes] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True)
class TokenLogprobs:
    token_id: int  # the sampled token
    logprob: float  # its log-probability under the model's raw distribution
    top: list[tuple[int, float]]  # the most likely alternatives, best first
    rank: int | None = None  # prompt logprobs: 1 + the number of likelier tokens


@dataclass(slots=True)
class ModelRunnerOutput:
    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)  # new tokens; [] mid-prefill
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # only requests that asked
    # Requests that asked for prompt logprobs: one entry per position p+1 predicted by a prompt position p
    # computed this step (the chunk's first computed position predicts the entry for start + 1).
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    failed_request_ids: dict[str, str] = field(default_factory=dict)  # request -> error message
    # Embedding requests whose prompt's last chunk ran this step: the pooled, L2-normalized hidden state.
    pooled: dict[str, list[float]] = field(default_factory=dict)


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's progress in one step, for the output processor."""

    request_id: str
    new_token_ids: list[int]  # tokens sampled this step
    new_logprobs: list[TokenLogprobs] | None  # per new token, when asked for
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" once finished
    stop_reason: int | str | None = None  # the stop token id that ended it, if any
    num_cached_tokens: int = 0  # prompt tokens that came from the prefix cache
    error: str | None = None  # message when finish_reason == "error"
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt positions 1.. (all of them), with the first token
    embedding: list[float] | None = None  # an embedding request's pooled vector, when it finishes
