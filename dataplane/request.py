"""The engine's view of one request: its tokens, progress, status and timings."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from dataplane.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3  # EOS, a stop token or a stop string
    FINISHED_LENGTH = 4  # max_tokens or the context length
    FINISHED_ABORTED = 5  # the caller gave up (client disconnect, abort())
    FINISHED_ERROR = 6  # the engine failed on this request

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _REASONS.get(self)


_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True)
class RequestTimes:
    arrival: float  # time.monotonic() when the engine accepted it
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    priority: int = 0  # lower runs first
    cache_salt: str | None = None  # tenants share prefix-cache blocks only when they share a salt
    adapter: str | None = None  # LoRA adapter name; part of every block hash
    wait_for: Request | None = None  # an n>1 sibling whose prompt blocks this one reuses
    tenant: str | None = None  # fair-share key (the gateway's X-Tenant-Id); None: the anonymous bucket
    tenant_weight: float = 1.0  # the tenant's share of its tier under fair sharing (scheduler/fairness.py)
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)  # prompt + output, appended in place
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache (or being computed by a step in flight)
    # Tokens being sampled by steps in flight (overlapped scheduling): not yet known to the host, but a
    # next step can already compute them (their ids stay on the device).
    num_pending: int = 0
    num_cached_tokens: int = -1  # prompt tokens served by the prefix cache (set at first schedule)
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None  # the stop token or string that ended it
    block_hashes: list[bytes] = field(default_factory=list)  # one per full block of all_token_ids
    prompt_logprobs: list = field(default_factory=list)  # TokenLogprobs of prompt positions 1, 2, ... so far
    times: RequestTimes = field(default_factory=lambda: RequestTimes(arrival=time.monotonic()))
    seq: int = 0  # arrival order, breaks ties among equal priorities
    # aging counts from here (None: arrival); fair sharing hands a tier's ages to the requests it puts first
    aged_from: float | None = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs and some are still to compute (their logits need the forward pass)."""
        return (self.sampling_params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def effective_priority(self, now: float, aging_seconds: float) -> int:
        """Priority improved by one level per `aging_seconds` waited since arrival, so nothing starves."""
        start = self.times.arrival if self.aged_from is None else self.aged_from
        return self.priority - int((now - start) / aging_seconds)
