"""What callers of the engine get back: plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.scheduler.output import TokenLogprobs


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float  # time.monotonic() at admission
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the n completions
    text: str  # the whole text so far (offline) or the new text (streaming delta)
    token_ids: list[int]  # likewise, whole or new
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    logprobs: list[TokenLogprobs] | None = None  # per token in token_ids, when asked for
    error: str | None = None  # message when finish_reason == "error"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # for a streaming delta: only the completions that moved
    finished: bool  # every completion has finished
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))
    prompt: str | None = None
    # Asked for with prompt_logprobs: per prompt token, None for the first (nothing predicts it); in a
    # stream, on the delta that carries the first generated token only.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    embedding: list[float] | None = None  # an embedding request (SamplingParams.pooling): its vector, once finished

    # The first completion, for the common n == 1 case.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
