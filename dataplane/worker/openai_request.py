"""One OpenAI request through the engine: parse, tokenize, check, generate, answer (whole or streamed).

Errors the client can fix surface before anything is queued, as 400s naming the field. The
gateway's token allowance (`X-Token-Allowance`: what it reserved under the tenant's limits) is
enforced here, where the prompt's real length is known: a prompt that leaves no room for its
completions is refused, and the completions are cut so the whole request fits. A stream
sends its headers with its first delta, not before: a full queue (429) or a failure on the first
step (500) is then still an HTTP status, which the gateway can act on; afterwards a failure is
reported in-band as `data: {"error": ...}`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

from pydantic import ValidationError
from starlette.responses import Response

from dataplane.engine.async_llm import AsyncLLM, EngineDeadError
from dataplane.errors import QueueFullError
from dataplane.outputs import RequestOutput
from dataplane.worker import errors
from dataplane.worker.adapters import resolve_model
from dataplane.worker.config import WorkerConfig
from dataplane.worker.disaggregation import PrefillClient
from dataplane.worker.generation import Generation, Job, RequestContext
from dataplane.worker.metrics import WorkerMetrics
from dataplane.worker.protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest
from dataplane.worker.render import Renderer, TokenText
from dataplane.worker.streaming import EventStream, race_disconnect
from dataplane.worker.tool_parsers import get_parser, guess_parser
from dataplane.worker.tool_parsers import template as tool_templates
from dataplane.worker.usage_memory import RequestUsage, UsageMemory

R = TypeVar("R", bound=GenerationRequest)



class Serving:
    def __init__(self, engine: AsyncLLM, config: WorkerConfig, metrics: WorkerMetrics,
                 usage: UsageMemory | None = None) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.usage = usage if usage is not None else UsageMemory(config.usage_memory_entries,
                                                                 config.usage_memory_seconds)
        self.text = TokenText(engine.tokenizer)
        self.active: set[str] = set()  # engine request ids in use
        # Disaggregated serving (disaggregation.py): long prompts' blocks are fetched from a prefill worker first
        self.prefill: PrefillClient | None = None
        # tool_choice auto: the parser named by the setting, or the one the model's template implies
        model_template = getattr(getattr(engine.tokenizer, "hf", None), "chat_template", None)
        setting = config.tool_call_parser
        self.tool_parser_name = guess_parser(model_template) if setting == "auto" else None if setting == "none" else setting
        self.tool_parser = get_parser(self.tool_parser_name) if self.tool_parser_name else None
        self.tool_template = tool_templates.tool_template(self.tool_parser_name, model_template)

    # -- parsing and checks (nothing queued yet) -----------------------------------------------
    def prepare_chat(self, raw: bytes, allowance: int | None = None) -> Job:
        req = _parse(ChatCompletionRequest, raw)
        adapter = resolve_model(req.model, self.config.model_id, self.engine)
        conversation = req.conversation()
        req.use_tool_parser(self.tool_parser, self.config.tool_call_constraint)
        tool_mode = req.tool_mode
        try:
            if self.tool_template is not None and tool_templates.uses_tools(conversation, req.tools):
                ids = tool_templates.render(self.engine.tokenizer.hf, conversation, req.tools, self.tool_template)
            else:
                ids = self.engine.tokenizer.apply_chat_template(conversation, tools=req.tools)
        except ValueError as exc:
            raise errors.from_value_error(exc, "messages") from None
        except Exception as exc:  # noqa: BLE001 - the template refused the conversation (jinja raised)
            raise errors.invalid(f"messages: the chat template refused them: {exc}", "messages") from None
        max_tokens = self._max_tokens(req.requested_max_tokens, [ids], "messages", self.config.default_max_tokens)
        job = self._job(req, True, [ids], max_tokens, req.num_logprobs, "messages", None, adapter, allowance)
        job.tools = tool_mode
        job.prompt_logprobs = req.prompt_logprobs
        return job

    def prepare_completion(self, raw: bytes, allowance: int | None = None) -> Job:
        req = _parse(CompletionRequest, raw)
        adapter = resolve_model(req.model, self.config.model_id, self.engine)
        prompts = req.prompts()
        tok = self.engine.tokenizer
        ids = [tok.encode(p) if isinstance(p, str) else p for p in prompts]
        echo = [p if isinstance(p, str) else tok.decode(p) for p in prompts] if req.echo else None
        max_tokens = self._max_tokens(req.max_tokens, ids, "prompt", 16)  # 16: OpenAI's completions default
        job = self._job(req, False, ids, max_tokens, req.logprobs, "prompt", echo, adapter, allowance)
        job.echo_logprobs, job.prompt_logprobs = (req.logprobs if req.echo else None), req.prompt_logprobs
        return job

    def _max_tokens(self, requested: int | None, prompts: list[list[int]], param: str, default: int) -> int:
        limit, longest = self.engine.max_model_len, max(len(p) for p in prompts)
        if requested is None:
            if longest >= limit:
                raise errors.context_length_exceeded(limit, longest, 1, param)
            return min(default, limit - longest)
        if requested >= 1 and longest + requested > limit:
            raise errors.context_length_exceeded(limit, longest, requested, param)
        return requested  # < 1 is refused by SamplingParams, naming max_tokens

    def _job(self, req: GenerationRequest, chat: bool, prompts: list[list[int]], max_tokens: int, logprobs: int | None,
             param: str, echo: list[str] | None, adapter: str | None = None, allowance: int | None = None) -> Job:
        try:
            params = req.sampling_params(max_tokens, logprobs)
        except ValueError as exc:
            raise errors.from_value_error(exc, param) from None
        if params.n * len(prompts) > self.config.max_n:
            raise errors.invalid(f"n: at most {self.config.max_n} completions per request on this worker "
                                 f"(asked for {params.n * len(prompts)})", "n")
        if allowance is not None:
            params.max_tokens = _within_allowance(allowance, prompts, params.n, params.max_tokens, param)
        return Job(chat, prompts, params, bool(req.stream), req.include_usage, req.priority, echo, adapter)

    # -- running -------------------------------------------------------------------------------
    async def run(self, job: Job, ctx: RequestContext) -> Response:
        """The response: JSON, or an EventStream whose `on_close` the caller sets (to release its ticket)."""
        prio = _priority(ctx.priority, job.priority)
        self._admit(prio)
        if job.params.structured is not None:
            self.metrics.structured.labels(self.config.model_id, job.params.structured.kind).inc()
        trace = self.metrics.trace(prio, ctx.started)
        prefix = "chatcmpl-" if job.chat else "cmpl-"
        r = Renderer(chat=job.chat, response_id=prefix + ctx.request_id, created=int(time.time()),
                     model=job.adapter or self.config.model_id, include_usage=job.include_usage,
                     logprobs=job.params.logprobs is not None, text=self.text, tools=job.tools)
        param = "messages" if job.chat else "prompt"
        usage = self.usage.start(ctx.request_id, sum(len(p) for p in job.prompts), len(job.prompts))
        events = self._events(job, ctx, prio, usage)
        gen = Generation(job, ctx, r, trace, events, lambda exc: self.engine_error(exc, param), usage,
                         lambda status: self.usage.finish(usage, status))
        try:
            if not job.stream:
                return Response(await race_disconnect(ctx.receive, gen.collect()), media_type="application/json")
            first = await race_disconnect(ctx.receive, gen.first())
        except BaseException:
            await gen.close()  # also when the work was cancelled before it began: aborted and accounted
            raise
        timing = engine_timing(ctx.started, first[1] if first is not None else None, time.monotonic())
        return EventStream(gen.stream(first), gen.close, headers={"Server-Timing": timing} if timing else None)

    async def _events(self, job: Job, ctx: RequestContext, priority: int, usage: RequestUsage
                      ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Deltas of every prompt of the job, tagged with the prompt's index; aborts all on close.

        Each delta is counted into `usage` as it arrives from the engine, not as the client takes
        it: tokens still queued behind a slow client when it leaves were generated, and are billed."""
        prefill = self._prefill_client(ctx.prefill_url)
        if prefill is not None:
            wanted = [p for p in job.prompts if prefill.wants(p, job.adapter)]
            if wanted:  # before any engine request exists: a client leaving meanwhile leaves nothing behind
                await asyncio.gather(*(prefill.prepare(p, ctx.cache_salt, priority, ctx.prefill_url)
                                       for p in wanted))
        ids = [self._claim(ctx.request_id if len(job.prompts) == 1 else f"{ctx.request_id}-{i}")
               for i in range(len(job.prompts))]
        gens = [self.engine.generate(p, job.params, request_id=rid, priority=priority, cache_salt=ctx.cache_salt,
                                     adapter=job.adapter, tenant=ctx.tenant, tenant_weight=ctx.tenant_weight)
                for p, rid in zip(job.prompts, ids, strict=True)]
        merged = _merge(gens, usage)
        try:
            async for item in merged:
                yield item
        finally:
            await merged.aclose()  # stops the pumps first: a generator a pump is inside cannot be closed
            for g in gens:
                await g.aclose()  # aborts the engine request if it has not finished
            self.active.difference_update(ids)

    def _prefill_client(self, named: str | None) -> PrefillClient | None:
        """The worker's own (--prefill-url), or, for a prefill worker the gateway named, one made on first use;
        None when this engine has no second tier to receive blocks into (it computes its prompts itself)."""
        if named is None or not named.startswith(("http://", "https://")):
            own = self.prefill is not None and self.prefill.urls is not None  # --prefill-url
            return self.prefill if own else None
        if self.prefill is None and getattr(self.engine, "has_second_tier", False):
            self.prefill = PrefillClient(self.engine, [], self.config.token, self.config.prefill_min_tokens,
                                         self.config.prefill_timeout, self.metrics)
        return self.prefill

    def _admit(self, priority: int) -> None:
        """Shed low priorities first: refuse while the waiting queue is at this priority's limit."""
        limit = self.config.waiting_limit(priority)
        if limit is None:
            return
        waiting = self.engine.core.scheduler.num_waiting  # a racy read is fine for a threshold
        if waiting >= limit:
            raise errors.WorkerError(
                f"{waiting} requests are waiting (limit {limit} for priority {priority}); lower priorities are "
                "shed first under load.", status=429, code="priority_shed",
                headers={"Retry-After": str(self.config.retry_after)})

    def _claim(self, request_id: str) -> str:
        rid = request_id
        while rid in self.active:
            rid = f"{request_id}-{uuid.uuid4().hex[:8]}"
        self.active.add(rid)
        return rid

    def engine_error(self, exc: BaseException, param: str) -> errors.WorkerError | None:
        if isinstance(exc, QueueFullError):
            return errors.queue_full(str(exc), self.config.retry_after)
        if isinstance(exc, ValueError):
            return errors.from_value_error(exc, param)
        if isinstance(exc, EngineDeadError):
            return errors.unavailable("The engine stopped; this worker cannot serve requests.",
                                      self.config.retry_after, "engine_dead")
        return None


def _parse(model: type[R], raw: bytes) -> R:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from None


def _priority(header: int | None, body: int | None) -> int:
    """The gateway's X-Priority is the tenant's; a body `priority` may only lower it (a larger number)."""
    if header is None:
        return body or 0
    return header if body is None else max(header, body)


def _within_allowance(allowance: int, prompts: list[list[int]], n: int, max_tokens: int, param: str) -> int:
    """Per-choice max_tokens such that prompt + every completion fits the gateway's allowance."""
    # max_tokens 0 scores the prompt: only the prompt must fit
    prompt_tokens, choices = sum(len(p) for p in prompts), len(prompts) * n if max_tokens else 0
    if prompt_tokens + choices > allowance:  # not even one token per completion
        raise errors.WorkerError(
            f"The prompt has {prompt_tokens} tokens; this request was allowed {allowance} tokens in all under your "
            f"limits (prompt + completions), which leaves no room for its {choices} completion(s). Shorten the "
            f"{param} or ask for fewer completions.", status=400, code="token_allowance_exceeded", param=param)
    return min(max_tokens, (allowance - prompt_tokens) // choices) if choices else 0


async def _merge(gens: list[AsyncIterator[RequestOutput]], usage: RequestUsage
                 ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave the prompts' deltas as they come, counting each into `usage` on arrival (a task per
    prompt drains the engine's queue whatever the client's pace); the first failure ends the batch."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in gen:
                usage.add(i, out.num_cached_tokens, sum(len(o.token_ids) for o in out.outputs))
                queue.put_nowait((i, out))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def engine_timing(started: float, first: RequestOutput | None, now: float) -> str:
    """A stream's `Server-Timing` at its first event, in milliseconds: accept (HTTP, tokenizing, the
    template: until the engine took it), queue (until first scheduled), prefill (until its first token)
    and send (until now, the headers' going out). Durations only: nothing of other requests."""
    m = first.metrics if first is not None else None
    if m is None or m.first_scheduled_time is None or m.first_token_time is None:
        return ""
    marks = (("accept", started, m.arrival_time), ("queue", m.arrival_time, m.first_scheduled_time),
             ("prefill", m.first_scheduled_time, m.first_token_time), ("send", m.first_token_time, now))
    return ", ".join(f"{name};dur={max(0.0, (b - a) * 1000):.1f}" for name, a, b in marks)
