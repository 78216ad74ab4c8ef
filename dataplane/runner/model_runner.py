"""Executes one scheduled step: builds the flattened ragged batch, runs the model, samples.

The runner keeps a small per-request state (tokens, block table) updated from each
SchedulerOutput, so a continuing request costs the scheduler only its new block ids.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from dataplane.lora.runtime import LoRARuntime
from dataplane.models.llama import LlamaModel
from dataplane.runner.attention import AttentionMetadata, build_decode_groups, make_prefill_chunk
from dataplane.runner.pooling import PoolSpan, pool, pool_span
from dataplane.runner.prompt_logprobs import prompt_logprobs
from dataplane.sampling.sampler import Sampler, SamplingRow
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from dataplane.spec_decode.verify import accepted_tokens
from dataplane.structured.backend import GrammarBackend, Matcher

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunnerRequestState:
    token_ids: list[int]  # prompt + outputs known to the runner
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int
    params: SamplingParams
    adapter: str | None
    matcher: Matcher | None = None  # structured outputs: the grammar's state (built at first sampling)
    pool_sum: torch.Tensor | None = None  # mean-pooled embeddings: the sum of the chunks pooled so far


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, seed: int = 0,
                 lora: LoRARuntime | None = None, structured: GrammarBackend | None = None) -> None:
        self.model = model
        self.lora = lora  # device slots and per-step adapter metadata, when LoRA is enabled
        self.structured = structured  # compiles and matches grammars of structured-output requests
        # Grammar masks are filled on a thread while the model runs (they depend only on tokens already
        # accepted); the step waits only for what is left of that, and for applying them.
        self._grammar_pool: ThreadPoolExecutor | None = None
        self.grammar_seconds = 0.0  # the step's own time on masks: waiting for the fill, applying
        self.grammar_fill_seconds = 0.0  # filling, on the grammar thread (overlapped with the model)
        self.block_size = block_size
        a = model.args
        shape = (num_blocks, block_size, a.num_kv_heads, a.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=model.dtype, device=model.device),
             torch.zeros(shape, dtype=model.dtype, device=model.device))
            for _ in range(a.num_layers)
        ]
        self.sampler = Sampler(seed)
        self.states: dict[str, RunnerRequestState] = {}

    @staticmethod
    def kv_bytes_per_token(model: LlamaModel) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
        a = model.args
        return 2 * a.num_layers * a.num_kv_heads * a.head_dim * model.embed.element_size()

    def _sync_states(self, out: SchedulerOutput) -> None:
        for rid in out.finished_request_ids:
            self.states.pop(rid, None)
        for rid in out.preempted_request_ids:
            self.states.pop(rid, None)
        for new in out.new_requests:
            self.states[new.request_id] = RunnerRequestState(
                list(new.token_ids), new.num_prompt_tokens, list(new.block_ids), new.num_computed_tokens,
                new.sampling_params, new.adapter)
        for c in out.cached_requests:
            st = self.states[c.request_id]
            st.block_ids.extend(c.new_block_ids)
            st.num_computed_tokens = c.num_computed_tokens

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self._sync_states(out)
        result = ModelRunnerOutput()
        if out.is_empty:
            return result
        bs = self.block_size
        sched = out.num_scheduled_tokens
        decodes = sorted((rid for rid, n in sched.items() if n == 1),
                         key=lambda rid: self.states[rid].num_computed_tokens)
        prefills = [rid for rid, n in sched.items() if n > 1]
        spec = out.spec_token_ids  # speculating requests: their last known token + drafts run as one chunk
        order = decodes + prefills

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sampled: list[str] = []
        chunks: list[tuple[int, int, int, list[int]]] = []
        prompt_rows: list[tuple[str, range, list[int]]] = []  # (request, rows, the tokens they predict)
        pool_spans: list[PoolSpan] = []  # embedding requests' rows to pool
        for rid in order:
            st = self.states[rid]
            n = sched[rid]
            start = st.num_computed_tokens
            row0 = len(input_ids)
            drafts = spec.get(rid)
            input_ids.extend(st.token_ids[start : start + n] if drafts is None else [st.token_ids[start], *drafts])
            pos = range(start, start + n)
            positions.extend(pos)
            table = st.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            if n > 1:
                chunks.append((row0, row0 + n, start, table[: -(-(start + n) // bs)]))
            if drafts is not None:  # a draft verification: every row samples (spec_decode/verify.py)
                logits_rows.extend(range(row0, row0 + n))
                sampled.extend([rid] * n)
            elif start + n == len(st.token_ids) and st.params.max_tokens:  # the chunk reaches the end: sample
                logits_rows.append(row0 + n - 1)
                sampled.append(rid)
            if st.params.prompt_logprobs is not None and start < st.num_prompt_tokens - 1:
                end = min(start + n, st.num_prompt_tokens - 1)  # position p predicts prompt token p + 1
                prompt_rows.append((rid, range(row0, row0 + end - start), st.token_ids[start + 1 : end + 1]))
            if st.params.pooling is not None and (span := pool_span(rid, st.params.pooling, row0, start, n,
                                                                    st.num_prompt_tokens)):
                pool_spans.append(span)

        device = self.model.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_size=bs,
            decode_groups=build_decode_groups(
                [self.states[r].num_computed_tokens + 1 for r in decodes],
                [self.states[r].block_ids for r in decodes], bs, device),
            prefills=[make_prefill_chunk(s, e, p, t, device) for s, e, p, t in chunks],
        )
        masks = self._begin_masks(sampled)
        lora = None
        if self.lora is not None:
            lora = self.lora.prepare([(self.states[rid].adapter, sched[rid]) for rid in order], len(decodes))
        try:
            hidden = self.model.hidden_states(
                torch.tensor(input_ids, dtype=torch.long, device=device),
                torch.tensor(positions, dtype=torch.long, device=device),
                meta, self.kv_caches, lora=lora,
            )
            logits = self.model.logits(hidden, torch.tensor(
                logits_rows + [r for _, rows, _ in prompt_rows for r in rows], dtype=torch.long, device=device))
            if pool_spans:
                self._pool(hidden, pool_spans, result)
        except BaseException:
            if masks is not None:
                masks.exception()  # let the fill finish before the states it reads can change
            raise
        for rid in order:
            self.states[rid].num_computed_tokens += sched[rid]
        if prompt_rows:
            result.prompt_logprobs = prompt_logprobs(logits[len(logits_rows):], prompt_rows,
                                                     {rid: self.states[rid].params.prompt_logprobs
                                                      for rid, _, _ in prompt_rows})
            logits = logits[: len(logits_rows)]
        if not sampled:
            return result
        rows = []
        seen: dict[str, int] = {}
        for rid in sampled:
            st = self.states[rid]
            j = seen[rid] = seen.get(rid, -1) + 1  # a verification's j-th row follows its first j drafts
            rows.append(SamplingRow(st.params, st.token_ids + spec[rid][:j] if j else st.token_ids,
                                    st.num_prompt_tokens))
        constrain = self._finish_masks(masks, result)
        tokens, logprobs = self.sampler(logits.cpu(), rows, constrain)
        if spec:
            sampled, tokens, logprobs = self._verify(spec, sampled, tokens, logprobs, result)
        for rid, tok, lp in zip(sampled, tokens, logprobs, strict=True):
            st = self.states[rid]
            if rid in result.failed_request_ids:
                continue
            if st.matcher is not None and not st.matcher.accept(tok):
                result.failed_request_ids[rid] = (f"{st.params.structured.source}: the grammar refused token {tok} "
                                                  "(no token it allows was left to sample)")
                continue
            st.token_ids.append(tok)
            result.sampled_token_ids[rid] = [tok]
            if lp is not None:
                result.logprobs[rid] = [lp]
        return result

    def _pool(self, hidden: torch.Tensor, spans: list[PoolSpan], result: ModelRunnerOutput) -> None:
        rows = torch.tensor([r for s in spans for r in s.rows], dtype=torch.long, device=hidden.device)
        mean = {s.request_id: self.states[s.request_id].pool_sum for s in spans
                if self.states[s.request_id].params.pooling == "mean"}
        result.pooled, partial = pool(self.model.final_norm(hidden[rows]), spans, mean,
                                      {s.request_id: self.states[s.request_id].num_prompt_tokens for s in spans})
        for rid, total in partial.items():
            self.states[rid].pool_sum = total

    def _verify(self, spec: dict[str, list[int]], sampled: list[str], tokens: list[int],
                logprobs: list[TokenLogprobs | None], result: ModelRunnerOutput,
                ) -> tuple[list[str], list[int], list[TokenLogprobs | None]]:
        """Settle the speculating requests' rows (spec_decode/verify.py); the other rows are returned."""
        rest: tuple[list[str], list[int], list[TokenLogprobs | None]] = ([], [], [])
        i = 0
        while i < len(sampled):
            rid = sampled[i]
            drafts = spec.get(rid)
            if drafts is None:
                for kept, value in zip(rest, (rid, tokens[i], logprobs[i]), strict=True):
                    kept.append(value)
                i += 1
                continue
            n = len(drafts) + 1
            emitted = accepted_tokens(drafts, tokens[i : i + n])
            st = self.states[rid]
            st.token_ids.extend(emitted)
            st.num_computed_tokens -= n - len(emitted)  # rejected drafts' slots: overwritten by the next step
            result.sampled_token_ids[rid] = emitted
            if logprobs[i] is not None:
                result.logprobs[rid] = logprobs[i : i + len(emitted)]
            i += n
        return rest

    def _begin_masks(self, sampled: list[str]) -> Future | None:
        """Start filling the grammar masks of this step's structured-output rows (None: there are none)."""
        constrained = [i for i, rid in enumerate(sampled) if self.states[rid].params.structured is not None]
        if not constrained:
            return None
        if self.structured is None:
            done: Future = Future()
            done.set_result((None, [], {sampled[i]: "structured outputs are not enabled on this engine"
                                        for i in constrained}))
            return done
        # Allocated here, on the engine thread: from 22 rows up the fill is a parallel torch op, and one
        # run on the mask thread gives that thread an OpenMP pool of its own for good, which throttles
        # every later step's barriers (passing_thread.py): batch-1 decode fell from 47 to 32 tok/s after
        # one 32-row structured step, for the engine's life (SmolLM2 bf16, 2 threads, AMD EPYC).
        bitmask = self.structured.allocate_bitmask(len(sampled))
        if self._grammar_pool is None:
            self._grammar_pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._grammar_pool.submit(self._fill_masks, bitmask, sampled, constrained)

    def _fill_masks(self, bitmask, sampled: list[str], constrained: list[int]) -> tuple[object, list[int], dict[str, str]]:
        """(bitmask, rows it masks, failures): a matcher that cannot be built fails its request.
        Runs no torch op (xgrammar writes the rows itself), so this thread never starts an OpenMP pool."""
        start = time.perf_counter()
        failed: dict[str, str] = {}
        masked = []
        for i in constrained:
            st = self.states[sampled[i]]
            try:
                if st.matcher is None:  # first sampling, or resumed after preemption: replay its outputs
                    st.matcher = self.structured.matcher(st.params.structured, st.token_ids[st.num_prompt_tokens:])
                st.matcher.fill(bitmask, i)
            except ValueError as exc:
                failed[sampled[i]] = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a grammar's failure is its request's, not the batch's
                log.exception("grammar mask failed", extra={"request_id": sampled[i]})
                failed[sampled[i]] = f"{st.params.structured.source}: grammar error: {exc}"
                continue
            masked.append(i)
        self.grammar_fill_seconds += time.perf_counter() - start
        return bitmask, masked, failed

    def _finish_masks(self, masks: Future | None, result: ModelRunnerOutput):
        """A function masking the constrained rows' logits in place, or None."""
        if masks is None:
            return None
        t0 = time.perf_counter()
        bitmask, masked, failed = masks.result()
        self.grammar_seconds += time.perf_counter() - t0
        result.failed_request_ids.update(failed)
        if not masked:
            return None

        def constrain(logits):
            t1 = time.perf_counter()
            self.structured.apply_bitmask(logits, bitmask, masked)
            self.grammar_seconds += time.perf_counter() - t1
        return constrain
