"""One request's generation as the client sees it: choices, usage, metrics, the final log line.

Token counts come from the request's `RequestUsage` (usage_memory.py), which counts every token as
it arrives from the engine; with `X-Tessera-Accounting: 1` each stream event opens with them as an
SSE comment, `: usage {"prompt_tokens":P,"cached_tokens":C,"completion_tokens":G}`, so the gateway
bills what was generated up to the last event it saw, not the deltas it relayed (a stop string held
back by the detokenizer can put many tokens into one delta).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson
from starlette.types import Receive

from dataplane.outputs import CompletionOutput, RequestOutput
from dataplane.sampling_params import SamplingParams
from dataplane.worker import errors, prompt_logprobs
from dataplane.worker.metrics import RequestTrace
from dataplane.worker.render import DONE, Choice, Renderer, usage
from dataplane.worker.tools import ToolMode
from dataplane.worker.usage_memory import RequestUsage

log = logging.getLogger("tessera.worker")


@dataclass(slots=True)
class RequestContext:
    request_id: str  # as the gateway (X-Request-Id) or the worker named it; echoed back
    tenant: str | None  # X-Tenant-Id, for logs
    priority: int | None  # X-Priority; lower runs first
    cache_salt: str | None  # X-Cache-Salt: prefix-cache blocks are shared only within one salt
    receive: Receive  # the ASGI channel, watched for the client's disconnect
    started: float  # time.monotonic() when the request was accepted
    accounting: bool = False  # X-Tessera-Accounting: 1 — open each stream event with the cumulative counts
    tenant_weight: float = 1.0  # X-Tenant-Weight: the tenant's share of its priority (fair sharing by `tenant`)
    # X-Tessera-Prefill-Url: the prefill worker the gateway named for this request (disaggregated serving; the
    # request is authenticated by the worker token, so only the gateway can name one)
    prefill_url: str | None = None


@dataclass(slots=True)
class Job:
    chat: bool
    prompts: list[list[int]]  # token ids, one list per prompt of a batch
    params: SamplingParams
    stream: bool
    include_usage: bool
    priority: int | None  # the body's `priority` extension
    echo: list[str] | None  # completions with echo: each prompt's text
    adapter: str | None = None  # the LoRA adapter `model` named (None: the base model)
    tools: ToolMode | None = None  # chat with tools to call (named, required or auto): see tools.py
    echo_logprobs: int | None = None  # completions' echo with logprobs: alternatives per prompt token
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: alternatives per prompt token

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n


Events = AsyncIterator[tuple[int, RequestOutput]]


class Generation:
    def __init__(self, job: Job, ctx: RequestContext, renderer: Renderer, trace: RequestTrace, events: Events,
                 map_error: Callable[[BaseException], errors.WorkerError | None], counts: RequestUsage,
                 on_finish: Callable[[str], None] = lambda status: None) -> None:
        self.job, self.ctx, self.r, self.trace, self.events = job, ctx, renderer, trace, events
        self.map_error = map_error
        self.counts = counts  # fed by the events' source as deltas arrive (serving._merge)
        self.on_finish = on_finish  # the usage memory's: final counts, by request id
        self.choices = [Choice(i) for i in range(job.num_choices)]
        self.queue_time: float | None = None
        self.prompt_logprobs: dict[int, list] = {}  # per prompt index, when the job asked for them
        self.status = "cancelled"  # until it ends otherwise: the client left, or the worker stopped
        self.done = False

    async def _next(self) -> tuple[int, RequestOutput] | None:
        try:
            return await anext(self.events, None)
        except Exception as exc:  # noqa: BLE001 - mapped to the client's error, or re-raised
            mapped = self.map_error(exc)
            if mapped is None:
                self.status = "internal_error"
                raise
            self.status = mapped.code or "error"
            raise mapped from None

    def _apply(self, item: tuple[int, RequestOutput], now: float) -> list[tuple[Choice, CompletionOutput]]:
        i, out = item
        if out.finished and self.queue_time is None:
            self.queue_time = out.metrics.queue_time
        if out.prompt_logprobs is not None:
            self.prompt_logprobs[i] = out.prompt_logprobs
        moved = []
        for o in out.outputs:
            c = self.choices[i * self.job.params.n + o.index]
            if o.token_ids:
                c.num_tokens += len(o.token_ids)
                self.trace.token(c.index, now)
            if o.finish_reason is not None:
                c.finish_reason, c.error = o.finish_reason, o.error
            moved.append((c, o))
        return moved

    def usage(self) -> dict:
        c = self.counts
        return usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens)

    def _frame(self) -> bytes:
        """The accounting comment that opens a stream event, when the gateway asked for it."""
        if not self.ctx.accounting:
            return b""
        return b": usage " + orjson.dumps(self.counts.counts()) + b"\n"

    def _failure(self) -> errors.WorkerError | None:
        failed = next((c for c in self.choices if c.finish_reason == "error"), None)
        if failed is None:
            return None
        self.status = "engine_error"
        return errors.internal(f"The engine failed on this request: {failed.error}")

    # -- whole response ------------------------------------------------------------------------
    async def collect(self) -> bytes:
        try:
            while (item := await self._next()) is not None:
                for c, o in self._apply(item, time.monotonic()):
                    if o.text:
                        c.text.append(o.text)
                    if o.logprobs:
                        c.logprobs.extend(o.logprobs)
            failure = self._failure()
            if failure is not None:
                raise failure
            self.status = "ok"
            body = self.r.response(self.choices, self.usage(), self.job.echo, self.job.params.n)
            j = self.job
            if j.echo_logprobs is not None or j.prompt_logprobs is not None:
                body = prompt_logprobs.add_to_response(
                    body, chat=j.chat, prompts=j.prompts, n=j.params.n, echo=j.echo, echo_k=j.echo_logprobs,
                    vllm_k=j.prompt_logprobs, computed=self.prompt_logprobs, text=self.r.text)
            return body
        finally:
            await self.close()  # on a disconnect: the engine request aborted, then its final counts

    # -- streaming -----------------------------------------------------------------------------
    async def first(self) -> tuple[int, RequestOutput] | None:
        """The first delta, before any header is sent: errors up to here are HTTP statuses."""
        try:
            item = await self._next()
        except BaseException:
            await self.close()
            raise
        if item is not None and any(o.finish_reason == "error" for o in item[1].outputs):
            self._apply(item, time.monotonic())
            failure = self._failure()
            await self.close()
            raise failure  # type: ignore[misc]
        return item

    async def stream(self, item: tuple[int, RequestOutput] | None) -> AsyncIterator[bytes]:
        try:
            if self.job.echo is not None and self.job.echo_logprobs is None:
                n = self.job.params.n
                yield self.r.event([self.r.chunk(c, self.job.echo[c.index // n], None, None) for c in self.choices],
                                   self._frame())
            while item is not None:
                chunks = []
                if self.job.echo_logprobs is not None and item[1].prompt_logprobs is not None:
                    chunks.extend(self._echo_chunks(item[0], item[1].prompt_logprobs))  # ahead of its completions
                for c, o in self._apply(item, time.monotonic()):
                    reason = o.finish_reason if o.finish_reason in ("stop", "length") else None
                    chunks.extend(self.r.chunks(c, o.text, o.logprobs, reason))
                if chunks:
                    yield self.r.event(chunks, self._frame())
                failure = self._failure()
                if failure is not None:
                    yield self._frame() + failure.sse_event()
                    return
                try:
                    item = await self._next()
                except errors.WorkerError as exc:
                    yield self._frame() + exc.sse_event()
                    return
            if self.job.include_usage:
                yield self._frame() + self.r.usage_event(self.usage())
            self.status = "ok"
            yield self._frame() + DONE
        finally:
            await self.close()

    def _echo_chunks(self, i: int, entries: list) -> list[dict]:
        """Echo with logprobs, streamed: prompt i's text and logprobs, once its logprobs are computed
        (they come with its first token), for each of its choices; their offsets then follow the echo."""
        j, n = self.job, self.job.params.n
        assert j.echo is not None and j.echo_logprobs is not None
        lp = prompt_logprobs.echo_logprobs(entries, j.prompts[i], j.echo_logprobs, self.r.text)
        out = []
        for c in self.choices[i * n : (i + 1) * n]:
            c.offset = len(j.echo[i])
            out.append({"index": c.index, "text": j.echo[i], "logprobs": lp, "finish_reason": None})
        return out

    async def close(self) -> None:
        """Abort what is still running in the engine, then account for the request (idempotent)."""
        try:
            await self.events.aclose()  # type: ignore[attr-defined]
        finally:
            self.finish()

    # -- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        self.on_finish(self.status)  # after the events closed: the counts are final
        reasons = [c.finish_reason for c in self.choices if c.finish_reason]
        if self.status == "cancelled":
            reasons += ["abort"] * sum(1 for c in self.choices if c.finish_reason is None)
        now = time.monotonic()
        self.trace.finish(reasons, self.queue_time, now)
        ttft = self.trace.ttft_seconds
        u = self.usage()
        log.info("request finished", extra={
            "request_id": self.ctx.request_id, "tenant": self.ctx.tenant, "priority": self.trace.priority,
            "endpoint": "chat" if self.job.chat else "completions", "stream": self.job.stream,
            "status": self.status, "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u["completion_tokens"], "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
            "n": self.job.num_choices, "finish_reasons": reasons,
            "ttft_ms": None if ttft is None else round(ttft * 1000, 1),
            "e2e_ms": round((now - self.ctx.started) * 1000, 1)})
