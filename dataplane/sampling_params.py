"""Per-request sampling parameters, validated before anything is scheduled."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.spec_decode.config import MAX_DRAFT_TOKENS
from dataplane.structured.params import StructuredOutputs

# Per-request limits that keep one request from slowing its batch mates (the stop search runs on the
# engine thread for every token of every request).
# OpenAI's documented limit: "Up to 4 sequences where the API will stop generating further tokens."
MAX_STOP_SEQUENCES = 4
# Characters per stop string. While a request runs, the detokenizer holds back the longest stop
# string minus one character, so a long stop string also delays streaming: 256 characters (~60
# tokens of delay at most) is far above real stop strings ("\n\n", "</answer>", "Observation:", a
# closing code fence), and keeps the held-back tail and the automaton small.
MAX_STOP_CHARS = 256
# Extra stop tokens: real models need a handful (end-of-turn, end-of-text, tool-call ends); each is
# checked per token per request.
MAX_STOP_TOKEN_IDS = 64
POOLING_TYPES = ("last", "mean")  # embeddings over a decoder's final hidden states, as vLLM's pooling runner


@dataclass(slots=True)
class SamplingParams:
    n: int = 1  # completions per prompt; siblings share the prompt's KV blocks
    max_tokens: int = 16  # new tokens at most
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 disables
    min_p: float = 0.0  # drop tokens below min_p * p(max)
    seed: int | None = None  # makes this request reproducible whatever its batch mates
    repetition_penalty: float = 1.0  # HF-style, over prompt and output tokens
    presence_penalty: float = 0.0  # OpenAI-style, over output tokens
    frequency_penalty: float = 0.0  # OpenAI-style, over output tokens
    stop: list[str] = field(default_factory=list)  # stop strings (excluded from the text)
    stop_token_ids: list[int] = field(default_factory=list)  # extra tokens that end the request
    ignore_eos: bool = False  # keep going past EOS (benchmarks)
    logprobs: int | None = None  # return the sampled token's logprob and this many alternatives
    prompt_logprobs: int | None = None  # each prompt token's logprob (the first has none) and this many alternatives
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Prompt-lookup speculative decoding (dataplane/spec_decode): up to this many n-gram draft tokens per
    # step, verified in the same forward pass; None: the engine's default; 0: never for this request.
    speculative_tokens: int | None = None
    structured: StructuredOutputs | None = None  # constrain the output (JSON schema, regex, ...)
    logit_bias: dict[int, float] | None = None  # OpenAI's: token id -> added to its logit, in [-100, 100]
    # Embeddings: "last" | "mean" pools the prompt's final hidden states (after the final norm, L2-normalized)
    # instead of generating; with max_tokens 0 (dataplane/runner/pooling.py).
    pooling: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or [])]
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n: must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if self.pooling is not None:
            if self.pooling not in POOLING_TYPES:
                raise ValueError(f"pooling: must be one of {', '.join(POOLING_TYPES)}, got {self.pooling!r}")
            if self.max_tokens != 0 or self.prompt_logprobs is not None or self.logprobs is not None:
                raise ValueError("pooling: an embedding request generates nothing: max_tokens must be 0, "
                                 "without logprobs or prompt_logprobs")
        if self.max_tokens == 0 and self.prompt_logprobs is None and self.pooling is None:
            # 0 scores a prompt or pools it: nothing else to return
            raise ValueError("max_tokens: must be an integer >= 1 (0 only with prompt logprobs), got 0")
        if self.max_tokens == 0 and self.n != 1:
            raise ValueError(f"n: a scored prompt (max_tokens 0) has one answer; got n={self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k: must be -1, 0 (disabled) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p: must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty: must be > 0, got {self.repetition_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty: must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty: must be in [-2, 2], got {self.frequency_penalty}")
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"stop: at most {MAX_STOP_SEQUENCES} stop sequences are accepted, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop: every stop sequence must be a non-empty string")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            longest = max(len(s) for s in self.stop)
            raise ValueError(f"stop: a stop sequence is {longest} characters; at most {MAX_STOP_CHARS} are accepted")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} are accepted, "
                             f"got {len(self.stop_token_ids)}")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids: every entry must be a token id (an integer >= 0)")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs: must be between 0 and 20, got {self.logprobs}")
        if self.prompt_logprobs is not None and (isinstance(self.prompt_logprobs, bool)
                                                 or not isinstance(self.prompt_logprobs, int)
                                                 or not 0 <= self.prompt_logprobs <= 20):
            raise ValueError(f"prompt_logprobs: must be an integer between 0 and 20, got {self.prompt_logprobs!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if self.speculative_tokens is not None and (
                isinstance(self.speculative_tokens, bool) or not isinstance(self.speculative_tokens, int)
                or not 0 <= self.speculative_tokens <= MAX_DRAFT_TOKENS):
            raise ValueError(f"speculative_tokens: must be an integer in [0, {MAX_DRAFT_TOKENS}], "
                             f"got {self.speculative_tokens!r}")
        if self.logit_bias:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias: must map token ids to biases")
            for tok, bias in self.logit_bias.items():
                if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
                    raise ValueError(f"logit_bias: {tok!r} is not a token id")
                if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
                    raise ValueError(f"logit_bias: the bias of token {tok} must be a number in [-100, 100], got {bias!r}")
        else:
            self.logit_bias = None
        if self.structured is not None:
            if not isinstance(self.structured, StructuredOutputs):
                raise ValueError("structured: expected StructuredOutputs")
            if self.ignore_eos:
                # The grammar ends the output with EOS; past it nothing can match.
                raise ValueError(f"ignore_eos: cannot be combined with {self.structured.source}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
