"""What each request really cost, kept after it ends so the gateway can bill it exactly.

The worker is the only party that knows a request's true token counts: it tokenized the prompt
(chat template included) and saw every token the engine generated, including those a stop string
held back and those a departed client was never sent. The gateway asks for them by its request id
(`GET /tessera/v1/requests/{id}/usage`) when a stream ended without a usage object, and its
sweeper asks for requests whose gateway died — minutes later, hence a memory of finished requests.

Running requests are all kept (the engine's queue bounds them); finished ones are kept in finish
order and dropped from the oldest on, beyond `max_entries` or after `max_age` seconds, so the
memory is bounded whatever the traffic (~400 bytes an entry with its id: 100k entries are ~40 MB).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable

RUNNING, FINISHED = "running", "finished"


class RequestUsage:
    """One client request's counts (all its prompts and choices), updated as tokens arrive."""

    __slots__ = ("request_id", "prompt_tokens", "cached", "completion_tokens", "status", "finished_at", "seq",
                 "_done")

    def __init__(self, request_id: str, prompt_tokens: int, num_prompts: int, seq: int = 0) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens  # billed: every prompt's ids, as usage.prompt_tokens reports
        self.cached = [0] * num_prompts  # prefix-cache hits per prompt, as the engine last reported them
        self.completion_tokens = 0  # generated so far, all choices, sent to the client or not
        self.status = RUNNING  # then the Generation's status: ok, cancelled, engine_error, ...
        self.finished_at: float | None = None
        self.seq = seq  # start order: of two requests under one id, the later one is remembered
        self._done: asyncio.Event | None = None  # made only when someone waits

    @property
    def state(self) -> str:
        return RUNNING if self.finished_at is None else FINISHED

    @property
    def cached_tokens(self) -> int:
        return sum(self.cached)

    def add(self, prompt_index: int, cached_tokens: int, new_tokens: int) -> None:
        """One engine delta of prompt `prompt_index`: its cache hits so far and its new tokens."""
        self.cached[prompt_index] = cached_tokens
        self.completion_tokens += new_tokens

    def counts(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens}

    def as_json(self) -> dict[str, object]:
        return {"request_id": self.request_id, "state": self.state, "status": self.status, **self.counts()}

    async def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the request to finish; True if it has."""
        if self.finished_at is None and timeout > 0:
            if self._done is None:
                self._done = asyncio.Event()
            try:
                await asyncio.wait_for(self._done.wait(), timeout)
            except TimeoutError:
                pass
        return self.finished_at is not None


class UsageMemory:
    def __init__(self, max_entries: int = 100_000, max_age: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_age = max_age
        self.clock = clock
        self.running: dict[str, RequestUsage] = {}
        self.finished: OrderedDict[str, RequestUsage] = OrderedDict()  # oldest finish first
        self._seq = itertools.count()

    def start(self, request_id: str, prompt_tokens: int, num_prompts: int = 1) -> RequestUsage:
        entry = RequestUsage(request_id, prompt_tokens, num_prompts, next(self._seq))
        self.running[request_id] = entry  # a second request under a running one's id: the later wins
        return entry

    def finish(self, entry: RequestUsage, status: str) -> None:
        """The request ended (any way); its counts are final. Wakes whoever waits for it."""
        if entry.finished_at is not None:
            return
        entry.status = status
        entry.finished_at = self.clock()
        rid = entry.request_id
        if self.running.get(rid) is entry:
            del self.running[rid]
        kept = self.finished.get(rid)
        if kept is None or kept.seq < entry.seq:
            self.finished[rid] = entry
            self.finished.move_to_end(rid)
        if entry._done is not None:
            entry._done.set()
        self._expire()

    def get(self, request_id: str) -> RequestUsage | None:
        self._expire()
        return self.running.get(request_id) or self.finished.get(request_id)

    async def wait(self, request_id: str, timeout: float) -> RequestUsage | None:
        """The request's entry once it has finished, or as it stands after `timeout` seconds."""
        entry = self.get(request_id)
        if entry is not None:
            await entry.wait(timeout)
        return entry

    def __len__(self) -> int:
        return len(self.running) + len(self.finished)

    def _expire(self) -> None:
        oldest = self.clock() - self.max_age
        finished = self.finished
        while finished and (len(finished) > self.max_entries
                            or next(iter(finished.values())).finished_at < oldest):  # type: ignore[operator]
            finished.popitem(last=False)
