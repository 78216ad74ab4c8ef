"""A scripted stand-in for AsyncLLM: the worker's HTTP logic tested with no model at all.

One character is one token (id = ord(c)). Each delta carries one token per completion; the
behaviour of the next requests is set on the engine (`fail`, `error_at`, `delay`, `gate`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

from dataplane.outputs import CompletionOutput, RequestMetrics, RequestOutput
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import TokenLogprobs
from dataplane.stats import SchedulerStats


class FakeTokenizer:
    eos_token_ids = (0,)
    backend = SimpleNamespace(decoder=None)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        if messages[-1]["role"] == "assistant" and messages[-1]["content"] == "refuse":
            raise RuntimeError("Conversation roles must alternate")
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")

    def id_to_token(self, token_id: int) -> str:
        return chr(token_id)


@dataclass
class Call:
    prompt: list[int]
    params: SamplingParams
    request_id: str
    priority: int
    cache_salt: str | None
    tenant: str | None = None
    tenant_weight: float = 1.0


@dataclass
class FakeEngine:
    max_model_len: int = 64
    model_name: str = "fake"
    fail: BaseException | None = None  # raised at the first step of the next requests
    error_at: int | None = None  # the step at which completions finish with "error"
    delay: float = 0.0  # seconds between deltas
    gate: asyncio.Event | None = None  # set it to let requests produce their first token
    text: str = "abcdefghijklmnopqrstuvwxyz"
    calls: list[Call] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    alive: bool = True

    def __post_init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.latest_stats = SchedulerStats(0, 0, 0.0, 0, 0, 0, 0, 0, 100, 100)

    def is_alive(self) -> bool:
        return self.alive

    def shutdown(self) -> None:
        self.alive = False

    async def generate(self, prompt, params: SamplingParams, *, request_id: str, priority: int = 0,
                       cache_salt: str | None = None, adapter: str | None = None, tenant: str | None = None,
                       tenant_weight: float = 1.0):
        if params.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {params.temperature}")
        self.calls.append(Call(list(prompt), params, request_id, priority, cache_salt, tenant, tenant_weight))
        finished = False
        try:
            if self.fail is not None:
                raise self.fail
            if self.gate is not None:
                await self.gate.wait()
            for step in range(params.max_tokens):
                if self.delay:
                    await asyncio.sleep(self.delay)
                last = step == params.max_tokens - 1
                error = self.error_at is not None and step == self.error_at
                tok = ord(self.text[step % len(self.text)])
                outs = []
                for i in range(params.n):
                    lp = None
                    if params.logprobs is not None:
                        lp = [TokenLogprobs(tok, -0.5, [(tok, -0.5), (tok + 1, -1.5), (tok + 2, -2.5)][:params.logprobs])]
                    outs.append(CompletionOutput(i, "" if error else chr(tok), [] if error else [tok],
                                                 "error" if error else ("length" if last else None),
                                                 None, None if error else lp, "boom" if error else None))
                finished = last or error
                yield RequestOutput(request_id, list(prompt), outs, finished, len(prompt) // 2,
                                    RequestMetrics(0.0, 0.001, 0.002, 0.003 if finished else None))
                if finished:
                    return
        finally:
            if not finished:
                self.aborted.append(request_id)
