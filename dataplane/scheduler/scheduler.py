"""Iteration-level scheduler: continuous batching, chunked prefill, priorities, preemption.

No prefill or decode phases: each request has `num_computed_tokens` and `num_tokens`, and each
step hands every scheduled request some of its remaining tokens under one token budget. A
prompt longer than the budget is simply computed over several steps (chunked prefill), in the
same forward pass as other requests' decodes. The scheduler alone owns the queues.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from dataplane.config import SchedulerConfig
from dataplane.errors import QueueFullError
from dataplane.kv_cache.manager import KVCacheManager
from dataplane.lora.fairness import AdapterAdmission
from dataplane.request import Request, RequestStatus
from dataplane.scheduler.fairness import VirtualTokenCounter
from dataplane.scheduler.output import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from dataplane.scheduler.step_cost import StepCostModel
from dataplane.spec_decode.proposer import draft_tokens
from dataplane.stats import SchedulerStats

# The ITL guard's timed step budget never cuts a step's prefill below this many tokens: a protected
# arrival's prompt must still start (a 40-token chat prompt then takes ~10 steps, well within TTFT).
ITL_GUARD_MIN_PREFILL = 4


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int,
                 clock: Callable[[], float] = time.monotonic, max_loras: int | None = None) -> None:
        self.config = config
        self.max_loras = max_loras  # distinct LoRA adapters among running requests at most (None: LoRA off)
        self._lora_retiring: set[str] = set()  # adapters draining to free a slot (dataplane/lora/fairness.py)
        self.kv = kv
        self.max_model_len = max_model_len
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._finished_since_schedule: set[str] = set()
        self._seq = 0
        self._guard_left: int | None = None  # this step's ITL-guard prefill budget (see _itl_guard_budget)
        self._step_prefill_left: int | None = None  # this step's prefill cap, all priorities (_step_prefill_cap)
        self._protected_waiting = False  # a protected request is waiting this step (first claim on the cap)
        self._online_present = False  # a request below background_priority is in the engine this step
        self.step_cost = StepCostModel()  # step time against tokens, for itl_guard_step_ms
        # `running` is kept in rank order; it must be sorted again once a request joins it or one's aged
        # priority may have changed (_sort_running)
        self._order_dirty = False
        self._order_valid_until = 0.0
        # tenants' service counters: the order of a tier's waiting requests (None: FCFS within a tier)
        self.fair = VirtualTokenCounter(config.fair_share_input_weight, config.fair_share_output_weight) \
            if config.fair_share else None
        self._fair_seen = -1  # requests the fair-share counter last observed (see _admit_waiting)
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.spec_num_drafts = 0  # verify steps that carried drafts (speculative decoding)
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0

    # -- admission ---------------------------------------------------------------------------
    def check_admissible(self, request: Request) -> None:
        """Refuse, with a reason, what can never run; called before anything is queued."""
        p = request.sampling_params
        if request.num_prompt_tokens == 0:
            raise ValueError("prompt: must contain at least one token")
        total = request.num_prompt_tokens + p.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt: this model's maximum context length is {self.max_model_len} tokens, but "
                f"{request.num_prompt_tokens} prompt tokens plus max_tokens={p.max_tokens} make {total}"
            )
        if self.kv.blocks_needed(total) > self.kv.num_blocks:
            raise ValueError(
                f"prompt: {total} tokens need {self.kv.blocks_needed(total)} KV blocks but the whole cache "
                f"has {self.kv.num_blocks}; lower max_tokens or give the engine more kv_cache_memory"
            )

    def add_request(self, request: Request) -> None:
        self.check_admissible(request)
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        limit = self.config.max_waiting
        if limit is not None and len(self.waiting) >= limit:
            raise QueueFullError(f"{len(self.waiting)} requests are waiting (limit {limit})")
        self._seq += 1
        request.seq = self._seq
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Abort or finish requests from outside a step; frees their blocks at once."""
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.status.finished:
                continue
            if req in self.waiting:
                self.waiting.remove(req)
            if req in self.running:
                self.running.remove(req)
            self._finish(req, status)
            done.append(req)
        return done

    # -- what others may ask (the queues are the scheduler's alone; callers on other threads read a length or
    # a count, a racy read that is fine for a threshold or a report) ---------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def adapter_in_use(self, key: str) -> bool:
        """A request of this adapter key is queued or running."""
        return any(r.adapter == key for r in list(self.requests.values()))

    def adapters_by_queue(self) -> tuple[list[str], list[str]]:
        """The adapter keys of running and of waiting requests (one entry per request)."""
        return ([r.adapter for r in list(self.running) if r.adapter is not None],
                [r.adapter for r in list(self.waiting) if r.adapter is not None])

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        aging = self.config.aging_seconds
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        def rank(r: Request) -> tuple[int, int]:
            return (r.effective_priority(now, aging), r.seq)

        self._guard_left = self._itl_guard_budget()
        self._online_present = self._any_online()
        self._step_prefill_left = self._step_prefill_cap()
        if self._order_dirty or now >= self._order_valid_until - 1e-6:
            self._sort_running(now, aging)
        # Drafts only while the batch is small: a CPU step's time grows with its tokens, so in a busy batch
        # k drafts per request cost more than their accepted tokens save (spec_decode/config.py).
        speculate = len(self.running) <= self.config.speculative.max_running
        spec_k = self.config.speculative.ngram_tokens  # requests may opt in with speculative_tokens
        bg = self.config.background_priority
        paused_from = bg if self._online_present and bg is not None else None  # _paused, once per step
        kv, scheduled, cached = self.kv, out.num_scheduled_tokens, out.cached_requests
        for req in list(self.running):
            if budget == 0:
                break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if paused_from is not None and req.priority >= paused_from:
                continue  # background work sits out while online work is in the engine (keeps its blocks)
            remaining = len(req.all_token_ids) + req.num_pending - req.num_computed_tokens
            if req.num_pending and len(req.output_token_ids) + req.num_pending >= req.sampling_params.max_tokens:
                continue  # its token in flight is its last (max_tokens): nothing more to compute
            if remaining == 1 and not (speculate and (spec_k or req.sampling_params.speculative_tokens)):
                # A decode: one token, no guard or cap applies (they limit prefill), and a new block only
                # every block_size tokens. The common case of a running batch, so kept lean.
                new = kv.append_slot(req)
                if new is None:
                    new = self._make_room(req, 1, out)
                    if new is None:
                        break
                cached.append(CachedRequestData(req.request_id, [b.block_id for b in new] if new else [],
                                                req.num_computed_tokens))
                scheduled[req.request_id] = 1
                budget -= 1
                continue
            n = self._chunk(remaining, budget, req)
            if n == 0:
                continue  # a guarded prefill waits for a step with guard budget left
            drafts = draft_tokens(req, budget, self.max_model_len, self.config.speculative) if speculate else []
            if drafts and kv.pool.num_free - kv.blocks_needed(len(drafts)) - 1 < len(self.running):
                drafts = []  # near the cache's end, drafts must not take the blocks other decodes need
            new = kv.allocate_slots(req, n + len(drafts)) if drafts else None
            if new is None:
                drafts = []  # a guess never preempts anyone: without room for it, a plain decode
                new = kv.allocate_slots(req, n)
            if new is None:
                new = self._make_room(req, n, out)
                if new is None:
                    break
            if drafts:
                out.spec_token_ids[req.request_id] = drafts
                n += len(drafts)
            cached.append(CachedRequestData(req.request_id, [b.block_id for b in new], req.num_computed_tokens))
            scheduled[req.request_id] = n
            self._take(req, n)
            budget -= n

        if not out.preempted_request_ids:
            budget = self._admit_waiting(out, budget, now, rank)

        out.total_num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        if kv.tier is not None:
            out.kv_saves, out.kv_loads = kv.take_transfers()
        out.finished_request_ids = self._finished_since_schedule
        self._finished_since_schedule = set()
        return out

    def _sort_running(self, now: float, aging: float) -> None:
        """Order running requests by aged priority, then arrival. Every request ages at the same rate,
        so the order holds until one of them crosses its next aging boundary (or one is admitted): the
        sort, ~0.6 us a request in Python, runs then and not every step."""
        valid_until = float("inf")

        def rank(r: Request) -> tuple[int, int]:
            nonlocal valid_until
            start = r.times.arrival if r.aged_from is None else r.aged_from
            levels = int((now - start) / aging)
            valid_until = min(valid_until, start + (levels + 1) * aging)
            return (r.priority - levels, r.seq)

        self.running.sort(key=rank)
        self._order_valid_until = valid_until
        self._order_dirty = False

    def _make_room(self, req: Request, n: int, out: SchedulerOutput):  # noqa: ANN202 - list[KVBlock] | None
        """Out of blocks: recompute-preempt the lowest-priority, latest request not yet scheduled this
        step (it may be `req` itself) until `req`'s n tokens fit; None when `req` was the one preempted."""
        while True:
            victim = next(r for r in reversed(self.running) if r.request_id not in out.num_scheduled_tokens)
            self._preempt(victim, out)
            if victim is req:
                return None
            new = self.kv.allocate_slots(req, n)
            if new is not None:
                return new

    def _chunk(self, remaining: int, budget: int, req: Request | None = None) -> int:
        n = min(remaining, budget)
        cap = self.config.long_prefill_token_threshold
        n = min(n, cap) if cap else n
        if req is not None and self._guarded(req, remaining):
            n = min(n, self._guard_left)  # a guarded prefill chunk (decodes, remaining == 1, pass freely)
        if self._step_prefill_left is not None and remaining > 1:
            # Protected requests waiting to start have the first claim on the capped prefill,
            # ahead of lower-priority prefills already running (the running ones go first otherwise).
            yield_to_waiting = self._protected_waiting and req is not None and req.priority > self.config.itl_guard_priority
            n = 0 if yield_to_waiting else min(n, self._step_prefill_left)
        return n

    def _any_online(self) -> bool:
        """Base priorities: aging orders the queue, it does not turn a batch line into online work."""
        bg = self.config.background_priority
        if bg is None:
            return False
        return any(r.priority < bg for r in self.running) or any(r.priority < bg for r in self.waiting)

    def _paused(self, req: Request) -> bool:
        bg = self.config.background_priority
        return self._online_present and bg is not None and req.priority >= bg

    @property
    def num_paused(self) -> int:
        """Background requests holding a seat and their blocks while online work runs (last step)."""
        bg = self.config.background_priority
        if bg is None or not self._online_present:
            return 0
        return sum(1 for r in self.running if r.priority >= bg)

    def _guarded(self, req: Request, remaining: int) -> bool:
        """A lower-priority prefill while the ITL guard applies this step."""
        return self._guard_left is not None and remaining > 1 and req.priority > self.config.itl_guard_priority

    def _itl_guard_budget(self) -> int | None:
        """Prefill tokens lower-priority requests may take this step (None: no guard applies).

        Base priorities, not aged ones: aging orders the queue; it must not switch the guard off."""
        p = self.config.itl_guard_priority
        if p is None:
            return None
        if any(r.priority <= p for r in self.running) or any(r.priority <= p for r in self.waiting):
            return self.config.itl_guard_tokens
        return None

    def _step_prefill_cap(self) -> int | None:
        """Prefill tokens this step may carry, all priorities together (None: no cap): the ITL
        guard's step cap, while a protected request is decoding (its prompt done): a fixed number
        of tokens, or what the step-time target leaves after this step's decodes, or the smaller."""
        p, cap, target_ms = self.config.itl_guard_priority, self.config.itl_guard_step_tokens, self.config.itl_guard_step_ms
        self._protected_waiting = False
        background = self.config.background_step_ms is not None and self.config.background_priority is not None \
            and not self._online_present
        if not background and (p is None or (cap is None and target_ms is None)):
            return None  # neither cap is configured: no list of decodes to build
        decoding = [r for r in self.running if r.num_tokens + r.num_pending - r.num_computed_tokens <= 1]
        if background:
            # Only background work: short steps, so an online arrival waits little for the step in flight.
            fits = self.step_cost.tokens_within(self.config.background_step_ms / 1000)
            return None if fits is None else max(fits - len(decoding), ITL_GUARD_MIN_PREFILL)
        if not any(r.priority <= p for r in decoding):
            return None
        self._protected_waiting = any(r.priority <= p for r in self.waiting)
        if target_ms is not None:
            fits = self.step_cost.tokens_within(target_ms / 1000)
            if fits is not None:  # None until the model has seen enough varied steps
                timed = max(fits - len(decoding), ITL_GUARD_MIN_PREFILL)
                cap = timed if cap is None else min(cap, timed)
        return cap

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """The runner's time for a step of `num_tokens`: fits the ITL guard's timed step budget."""
        self.step_cost.observe(num_tokens, seconds)

    def _guard_seats_full(self) -> bool:
        cap = self.config.itl_guard_seqs
        if cap is None:
            return False
        p = self.config.itl_guard_priority
        return sum(1 for r in self.running if r.priority > p and not self._paused(r)) >= cap

    def _take(self, req: Request, n: int) -> None:
        remaining = req.num_tokens + req.num_pending - req.num_computed_tokens
        if self._guarded(req, remaining):
            self._guard_left -= n
        if self._step_prefill_left is not None and remaining > 1:
            self._step_prefill_left -= n

    def _admit_waiting(self, out: SchedulerOutput, budget: int, now: float, rank) -> int:  # noqa: ANN001
        if not self.waiting:
            # Tenants that left are noticed the step after, as with a queue. With nobody waiting, requests
            # can only have left since the last observe (joining, or coming back from a preemption, goes
            # through the queue, which observes): the same count is the same requests, and observing them
            # again (~3 µs at batch 1, ~40 µs at 256 a step) changes nothing the next observe would not:
            # counters only grow, so the floor it lifts to is the same.
            if self.fair is not None and len(self.running) != self._fair_seen:
                self.fair.observe(self.running)
                self._fair_seen = len(self.running)
            return budget
        if self.fair is None:
            self.waiting.sort(key=rank)
        else:
            self.fair.observe(self.waiting + self.running)
            self._fair_seen = len(self.waiting) + len(self.running)
            self.waiting[:] = self.fair.order(self.waiting, rank)
        loras = None if self.max_loras is None else AdapterAdmission(self.max_loras, self.running, self._lora_retiring,
                                                                     self.waiting)
        i = 0
        while i < len(self.waiting) and budget > 0:
            req = self.waiting[i]
            leader = req.wait_for
            if leader is not None and not leader.status.finished and leader.num_computed_tokens < leader.num_prompt_tokens:
                i += 1  # an n>1 sibling waits for the leader's prompt blocks, then shares them
                continue
            if self._paused(req):
                i += 1  # background work is not started while online work is in the engine
                continue
            if loras is not None and not loras.admits(req.adapter):
                i += 1  # its adapter has no slot this step; requests of running adapters may go ahead
                continue
            if self._guard_left is not None and req.priority > self.config.itl_guard_priority and (
                    self._guard_left == 0 or self._guard_seats_full()):
                i += 1  # the ITL guard's prefill budget or seats are spent; a protected request may go
                continue
            if self._step_prefill_left == 0:
                break  # this step's prefill cap is spent, for every priority
            if len(self.running) >= self.config.max_num_seqs and not self._preempt_for(req, out, now):
                break
            # A request still owed prompt logprobs skips the prefix-cache lookup: cached positions
            # have no logits, so its whole prompt is computed (its blocks are still published for others).
            lookup = req.num_computed_tokens == 0 and not req.needs_prompt_logprobs
            hits, num_hit = self.kv.get_computed_blocks(req) if lookup else ([], 0)
            n = self._chunk(req.num_tokens - num_hit, budget, req)
            new = self.kv.allocate_slots(req, n, hits)
            while new is None and self._preempt_for(req, out, now):
                # The victim's chunk of this step is dropped and its blocks unpublished: they may be hits.
                hits, num_hit = self.kv.get_computed_blocks(req) if lookup else ([], 0)
                budget = self.config.max_num_batched_tokens - sum(out.num_scheduled_tokens.values())
                n = self._chunk(req.num_tokens - num_hit, budget, req)
                new = self.kv.allocate_slots(req, n, hits)
            if new is None:
                break  # strict order within priority: later requests do not jump ahead
            if loras is not None and out.preempted_request_ids:
                loras.refresh(self.running)  # preemptions may have emptied adapters' slots (never filled one)
            self.waiting.pop(i)
            self.kv.record_prefix_query(req.num_tokens, num_hit)
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            if req.times.first_scheduled is None:
                req.times.first_scheduled = now
            self.running.append(req)
            self._order_dirty = True
            if loras is not None:
                loras.admitted(req.adapter)
            out.new_requests.append(NewRequestData(
                request_id=req.request_id, token_ids=list(req.all_token_ids),
                num_prompt_tokens=req.num_prompt_tokens, block_ids=self.kv.block_ids(req.request_id),
                num_computed_tokens=num_hit, sampling_params=req.sampling_params, adapter=req.adapter))
            out.num_scheduled_tokens[req.request_id] = n
            self._take(req, n)
            budget -= n
        return budget

    def _preempt_for(self, req: Request, out: SchedulerOutput, now: float) -> bool:
        """Make room for `req` by preempting a strictly lower-priority running request, if any."""
        aging = self.config.aging_seconds
        if not self.running:
            return False
        victim = max(self.running, key=lambda r: (r.effective_priority(now, aging), r.seq))
        if victim.effective_priority(now, aging) <= req.effective_priority(now, aging):
            return False
        if self.fair is not None and victim.priority == req.priority and victim.tenant != req.tenant:
            return False  # within a tier fairness chose who runs: aging must not undo it by preemption
        self._preempt(victim, out)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        if req.request_id in out.num_scheduled_tokens:  # its chunk of this step is dropped, never computed
            self.kv.forget_uncomputed(req)
        self.kv.free(req)
        self.running.remove(req)
        out.spec_token_ids.pop(req.request_id, None)
        if out.num_scheduled_tokens.pop(req.request_id, None) is not None:
            out.cached_requests = [c for c in out.cached_requests if c.request_id != req.request_id]
            out.new_requests = [c for c in out.new_requests if c.request_id != req.request_id]
        req.num_computed_tokens = 0
        req.num_pending = 0  # a token in flight for it is dropped when it arrives: it is recomputed and sampled again
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        self.waiting.append(req)
        out.preempted_request_ids.append(req.request_id)

    def advance(self, out: SchedulerOutput) -> None:
        """Overlapped scheduling: count a launched step's tokens as computed now, and its samples as
        pending, so the next step can be scheduled before this one's tokens reach the host."""
        running = RequestStatus.RUNNING
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status != running:
                continue
            out.starts[rid] = req.num_computed_tokens
            req.num_computed_tokens += n
            if req.num_computed_tokens >= req.num_tokens + req.num_pending and req.sampling_params.max_tokens:
                req.num_pending += 1  # every known and pending token is computed: this step samples
                out.pending.add(rid)
        out.advanced = True

    def update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance scheduled requests by what the runner computed; finish those that are done."""
        now = self.clock()
        outputs: list[EngineCoreOutput] = []
        requests, fair, failed, sampled = self.requests, self.fair, result.failed_request_ids, result.sampled_token_ids
        max_len = self.max_model_len
        running = RequestStatus.RUNNING
        generated = 0
        for rid, n in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None or req.status != running:
                continue
            if failed and rid in failed:
                self.running.remove(req)
                self._finish(req, RequestStatus.FINISHED_ERROR, forget=True)
                outputs.append(EngineCoreOutput(rid, [], None, "error", error=failed[rid]))
                continue
            num_prompt = len(req.prompt_token_ids)
            # advance() counted an overlapped step at launch (later steps may have been counted since)
            computed = out.starts[rid] if out.advanced else req.num_computed_tokens
            params = req.sampling_params
            prompt_part = 0
            if computed < num_prompt:
                prompt_part = min(computed + n, num_prompt) - computed
                self.prompt_tokens += prompt_part
                if result.prompt_logprobs:
                    self._add_prompt_logprobs(req, result.prompt_logprobs.get(rid), computed)
            rejected = self._rejected_drafts(out, rid, result) if out.spec_token_ids else 0
            req.num_computed_tokens = (req.num_computed_tokens if out.advanced else computed + n) - rejected
            if params.max_tokens == 0 and req.num_computed_tokens >= num_prompt:
                if fair is not None:
                    fair.charge(req, prompt_part, 0)
                self.running.remove(req)  # a scored prompt: its logprobs are the whole answer
                self._finish(req, RequestStatus.FINISHED_LENGTH)
                outputs.append(EngineCoreOutput(rid, [], None, "length", None, max(req.num_cached_tokens, 0),
                                                prompt_logprobs=req.prompt_logprobs))
                continue
            new_tokens = sampled.get(rid)
            if rid in out.pending:
                req.num_pending -= 1  # this step's sample has arrived: no longer in flight
            if not new_tokens:
                if fair is not None and prompt_part:
                    fair.charge(req, prompt_part, 0)
                continue  # mid-prefill chunk
            status = None
            if len(new_tokens) == 1:  # the common case, inline: append, then EOS / stop token / length
                tok = new_tokens[0]
                accepted = new_tokens
                req.output_token_ids.append(tok)
                req.all_token_ids.append(tok)
                if not params.ignore_eos and tok in req.eos_token_ids:
                    status = RequestStatus.FINISHED_STOPPED
                elif params.stop_token_ids and tok in params.stop_token_ids:
                    req.stop_reason = tok
                    status = RequestStatus.FINISHED_STOPPED
                elif len(req.output_token_ids) >= params.max_tokens or len(req.all_token_ids) >= max_len:
                    status = RequestStatus.FINISHED_LENGTH
            else:
                accepted = []
                for tok in new_tokens:
                    req.append_output_token(tok)
                    accepted.append(tok)
                    status = self._stop_status(req, tok)
                    if status is not None:
                        break
            generated += len(accepted)
            if fair is not None:
                fair.charge(req, prompt_part, len(accepted))
            times = req.times
            if times.first_token is None:
                times.first_token = now
            times.last_token = now
            logprobs = result.logprobs.get(rid) if result.logprobs else None
            if status is not None:
                self.running.remove(req)
                self._finish(req, status)
            # prompt logprobs ride on the first output only (not again after a preemption's recompute)
            prompt_lps = req.prompt_logprobs if params.prompt_logprobs is not None and \
                len(req.output_token_ids) == len(accepted) else None
            outputs.append(EngineCoreOutput(
                rid, accepted, logprobs[: len(accepted)] if logprobs else None,
                status.finish_reason if status else None, req.stop_reason, max(req.num_cached_tokens, 0),
                None, prompt_lps))
        self.generation_tokens += generated
        return outputs

    def _rejected_drafts(self, out: SchedulerOutput, rid: str, result: ModelRunnerOutput) -> int:
        """Draft tokens the model did not confirm. Their K/V slots were written but are not counted as
        computed, so the next step overwrites them; their blocks stay the request's (reused next step,
        freed with it) and are never published to the prefix cache (only blocks of known tokens are)."""
        drafts = out.spec_token_ids.get(rid)
        if not drafts:
            return 0
        accepted = max(len(result.sampled_token_ids.get(rid) or ()) - 1, 0)  # the last is the model's own
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += len(drafts)
        self.spec_num_accepted_tokens += accepted
        return len(drafts) - accepted

    @staticmethod
    def _add_prompt_logprobs(req: Request, entries: list | None, start: int) -> None:
        """Keep the entries past those already known (a recompute after preemption repeats them);
        `start`: the step's first computed position."""
        if not entries:
            return
        have = len(req.prompt_logprobs)  # entries[0] is position start + 1
        if start <= have:
            req.prompt_logprobs.extend(entries[have - start:])

    def _stop_status(self, req: Request, token: int) -> RequestStatus | None:
        p = req.sampling_params
        if not p.ignore_eos and token in req.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token in p.stop_token_ids:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, req: Request, status: RequestStatus, forget: bool = False) -> None:
        req.status = status
        req.times.finished = self.clock()
        self.kv.free(req, forget=forget)
        self.requests.pop(req.request_id, None)
        self._finished_since_schedule.add(req.request_id)

    def stats(self) -> SchedulerStats:
        pool = self.kv.pool
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting), kv_cache_usage=pool.usage(),
            prefix_cache_queries=pool.queries, prefix_cache_hits=pool.hits,
            num_preemptions=self.num_preemptions, prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens, num_blocks=pool.num_blocks, num_free_blocks=pool.num_free,
            num_paused=self.num_paused, spec_num_drafts=self.spec_num_drafts,
            spec_num_draft_tokens=self.spec_num_draft_tokens, spec_num_accepted_tokens=self.spec_num_accepted_tokens,
            kv_offload=replace(self.kv.tier.stats) if self.kv.tier is not None else None)
