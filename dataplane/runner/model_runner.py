"""Executes one scheduled step: builds the flattened ragged batch, runs the model, samples.

The runner keeps a small per-request state (tokens, block table) updated from each
SchedulerOutput, so a continuing request costs the scheduler only its new block ids.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from dataplane.lora.runtime import LoRARuntime
from dataplane.models.attention import AttentionMetadata, allocate_kv_cache, decode_groups, make_prefill_chunk
from dataplane.models.llama import LlamaModel
from dataplane.runner.block_transfer import BlockSink, read_blocks, write_blocks
from dataplane.runner.decode_graphs import DecodeGraphs
from dataplane.runner.grammar_masks import GrammarMasks
from dataplane.runner.input_batch import InputBatch
from dataplane.runner.pooling import PoolSpan, pool
from dataplane.runner.prompt_logprobs import prompt_logprobs
from dataplane.runner.request_state import RunnerRequestState
from dataplane.runner.steady_decodes import SteadyDecodes
from dataplane.runner.step_inputs import StepInputs, build_step_inputs
from dataplane.sampling.sampler import Sampler, SamplingBatch, SamplingRow, bias_entries
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from dataplane.spec_decode.verify import accepted_tokens
from dataplane.structured.backend import GrammarBackend
from kernels import kv_fp8

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StepHandle:
    """A launched step (ModelRunner.launch): its result so far and, until `finish`, its sampled tokens on
    the device."""

    result: ModelRunnerOutput
    sampled: list[str] = field(default_factory=list)  # the request of each sampled row
    states: list[RunnerRequestState] = field(default_factory=list)  # their runner states at launch
    rows: np.ndarray | None = None  # their InputBatch rows
    tokens: torch.Tensor | None = None  # sampled ids on the device; None once on the host (or none sampled)
    raw_logprobs: torch.Tensor | None = None  # the raw log-softmax of rows that want logprobs
    sampling: SamplingBatch | None = None


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, seed: int = 0,
                 lora: LoRARuntime | None = None, structured: GrammarBackend | None = None,
                 max_num_seqs: int = 64, max_model_len: int | None = None, kv_cache_dtype: str = "auto",
                 tier: BlockSink | None = None) -> None:
        self.model = model
        self.tier = tier  # the prefix cache's second tier: the step's saves and loads move bytes to and from it
        self.lora = lora  # device slots and per-step adapter metadata, when LoRA is enabled
        self.block_size = block_size
        a = model.args
        # One block past the pool's: the dummy block padded rows of a graph step write and read
        # (runner/decode_graphs.py). The scheduler never hands it out.
        self.dummy_block = num_blocks
        self.kv_cache_dtype = kv_cache_dtype
        layer = (num_blocks + 1, block_size, a.num_kv_heads, a.head_dim, model.dtype, model.device, kv_cache_dtype)
        self.kv_caches = [(allocate_kv_cache(*layer), allocate_kv_cache(*layer)) for _ in range(a.num_layers)]
        self.sampler = Sampler(seed, device=model.device)
        self.states: dict[str, RunnerRequestState] = {}
        # Grammar masks are filled on a thread while the model runs; the step waits only for what is left
        # of that, and for applying them.
        self.masks = GrammarMasks(structured, self.states)
        max_len = max_model_len or a.max_position
        self.batch = InputBatch(max_num_seqs, -(-max_len // block_size) + 1)
        # Attention that reads K/V through the block tables (the C++ decode op, the Triton kernels) takes
        # every decode as one group; the torch path gathers, so it groups decodes of similar length.
        self._one_decode_group = model.use_kernels or bool(getattr(model, "cpu_ops", False))
        self._num_structured = 0  # requests with a grammar: masks are built only while there are some
        self._num_adapters = 0  # requests on a LoRA adapter: the step's adapter context only while some
        self._num_host = 0  # requests whose every step needs its tokens on the host (needs_host)
        self.steps_reading_in_flight = 0  # launches whose inputs came from a step still in flight
        self.overlap = False  # the engine launches steps before the previous one's tokens are known
        self.graphs: DecodeGraphs | None = None  # decode-only steps from persistent buffers (use_graphs)
        # The last plain decode step, advanced in place while the same requests decode (steady_decodes.py)
        self.steady = SteadyDecodes(block_size, int32=model.use_kernels)
        self._on_cpu = model.device.type == "cpu"  # step inputs are numpy views, not copies

    def use_graphs(self, mode: str, max_num_seqs: int) -> DecodeGraphs:
        """Run decode-only steps through DecodeGraphs ('cuda': captured graphs; 'padded': the same padded
        step, eagerly)."""
        if self.lora is not None:
            self.lora.slots.allocate_all()  # graphs keep the slot buffers' addresses
        width = self.batch.block_table.shape[1]
        # tensor parallel rank 0 (distributed/launch.py): the other ranks replay with it
        peers = getattr(self.model, "graph_peers", None)
        if peers is not None:
            peers = peers(mode, max_num_seqs, width, self.dummy_block, self.kv_caches)
        self.graphs = DecodeGraphs(self.model, self.kv_caches, self.block_size, max_num_seqs, width, self.dummy_block,
                                   mode, self.lora, peers)
        return self.graphs

    @staticmethod
    def kv_bytes_per_token(model: LlamaModel, kv_cache_dtype: str = "auto") -> int:
        """2 (K and V) x layers x kv_heads x (head_dim x dtype bytes, or head_dim + 2 for FP8: a byte per
        value and a float16 scale per row)."""
        a = model.args
        row = kv_fp8.row_bytes(a.head_dim) if kv_cache_dtype == "fp8" else a.head_dim * model.embed.element_size()
        return 2 * a.num_layers * a.num_kv_heads * row

    def _drop(self, rid: str) -> None:
        st = self.states.pop(rid, None)
        if st is None:
            return
        self.batch.remove(st.row)
        self._num_structured -= st.params.structured is not None
        self._num_adapters -= st.adapter is not None
        self._num_host -= _needs_host(st.params)

    def _sync_states(self, out: SchedulerOutput) -> None:
        if out.finished_request_ids or out.preempted_request_ids or out.new_requests:
            self.steady.forget()
        for rid in out.finished_request_ids:
            self._drop(rid)
        for rid in out.preempted_request_ids:
            self._drop(rid)
        for new in out.new_requests:
            self._drop(new.request_id)  # resumed after a preemption the runner had not seen yet
            row = self.batch.add(new.sampling_params, new.token_ids, new.num_prompt_tokens, new.num_computed_tokens,
                                 new.block_ids)
            self.states[new.request_id] = RunnerRequestState(
                list(new.token_ids), new.num_prompt_tokens, new.sampling_params, new.adapter, row)
            self._num_structured += new.sampling_params.structured is not None
            self._num_adapters += new.adapter is not None
            self._num_host += _needs_host(new.sampling_params)
        batch, states = self.batch, self.states
        for c in out.cached_requests:
            if c.new_block_ids:
                batch.append_blocks(states[c.request_id].row, c.new_block_ids)
                self.steady.blocks_changed()

    @property
    def structured(self) -> GrammarBackend | None:
        """Compiles and matches the grammars of structured-output requests (None: not enabled)."""
        return self.masks.structured

    @structured.setter
    def structured(self, backend: GrammarBackend | None) -> None:
        self.masks.structured = backend

    @property
    def grammar_seconds(self) -> float:
        return self.masks.grammar_seconds

    @property
    def grammar_fill_seconds(self) -> float:
        return self.masks.grammar_fill_seconds

    @property
    def needs_host(self) -> bool:
        """Some live request's next step needs this step's tokens on the host (a grammar to advance,
        penalties to count, drafts to propose, prompt logprobs or pooling to hand back): no step may be
        left in flight (overlapped scheduling falls back to the synchronous step)."""
        return self._num_host > 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """One step, its tokens on the host when it returns."""
        return self.finish(self.launch(out))

    def launch(self, out: SchedulerOutput, prev: StepHandle | None = None) -> StepHandle:
        """Run a step up to its sampled tokens, left on the device (`finish` brings them to the host).
        `prev`: the step still in flight, whose sampled tokens are inputs of this one's decodes."""
        if torch.is_inference_mode_enabled():  # the caller runs in it: a nested context costs ~1.5 µs a step
            return self._launch(out, prev)
        with torch.inference_mode():
            return self._launch(out, prev)

    def _launch(self, out: SchedulerOutput, prev: StepHandle | None) -> StepHandle:
        if out.kv_saves or out.kv_loads:
            self._move_blocks(out)
        self._sync_states(out)
        result = ModelRunnerOutput()
        if out.is_empty:
            return StepHandle(result)
        sched = out.num_scheduled_tokens
        spec = out.spec_token_ids  # speculating requests: their last known token + drafts run as one chunk
        # A kept decode step where attention takes every decode as one group in the scheduler's order
        steady = not spec and self._one_decode_group
        in_flight = prev is not None and prev.tokens is not None
        step = self.steady.advance(self.batch, sched, in_flight) if steady else None
        if step is None:
            step = build_step_inputs(self.batch, self.states, sched, spec, self.block_size,
                                     sort_decodes=not self._one_decode_group)
            if steady:
                self.steady.keep(step, self.batch)
            else:  # a step the kept one did not follow (drafts move positions by more than one)
                self.steady.forget()
        patch = self._pending_inputs(step, prev)
        sampled = step.sampled
        masks = self.masks.begin(sampled) if self._num_structured else None
        try:
            logits = self._graph_logits(step, patch) if self.graphs is not None else None
            if logits is None:
                logits = self._eager_logits(step, sched, result, patch)
        except BaseException:
            if masks is not None:
                masks.exception()  # let the fill finish before the states it reads can change
            raise
        self._advance(step, sched)
        if step.prompt_rows:
            result.prompt_logprobs = prompt_logprobs(logits[len(step.logits_rows):], step.prompt_rows,
                                                     {rid: self.states[rid].params.prompt_logprobs
                                                      for rid, _, _ in step.prompt_rows})
            logits = logits[: len(step.logits_rows)]
        if not sampled:
            return StepHandle(result)
        constrain = self.masks.finish(masks, result)
        if spec:  # verification needs the tokens on the host now
            tokens, logprobs = self.sampler(logits, self._rows_one_by_one(sampled, spec), constrain)
            sampled, tokens, logprobs = self._verify(spec, sampled, tokens, logprobs, result)
            self._record(sampled, tokens, logprobs, result, None)
            return StepHandle(result)
        sampling = self._sampling_batch(step)
        tokens, raw = self.sampler.sample_tensor(logits, sampling, constrain)
        # Where the next step, launched before this one's tokens are known, finds them (a kept step's rows
        # sample in the same order every step: written when it was built)
        if self.overlap and not (step is self.steady.step and self.steady.advanced):
            self.batch.pending_index[step.sampled_rows] = np.arange(len(sampled))
        return StepHandle(result, sampled, self._launched_states(step), step.sampled_rows, tokens, raw, sampling)

    def _move_blocks(self, out: SchedulerOutput) -> None:
        """The second tier's traffic, before the forward: evicted blocks' bytes out (before anything
        overwrites them), then found blocks' bytes in (before anything reads them)."""
        if self.tier is None:
            raise RuntimeError("the scheduler moved KV blocks to a second tier the runner does not have")
        if out.kv_saves:
            rows, ready = read_blocks(self.kv_caches, [b for b, _ in out.kv_saves])
            self.tier.save([h for _, h in out.kv_saves], rows, ready)
        if out.kv_loads:
            write_blocks(self.kv_caches, list(out.kv_loads), list(out.kv_loads.values()))

    def _launched_states(self, step: StepInputs) -> list[RunnerRequestState]:
        """The sampled requests' states (finish skips a request whose state changed since): the kept decode
        step's stay the same while it is kept."""
        if step is not self.steady.step:
            return [self.states[rid] for rid in step.sampled]
        if self.steady.states is None:
            self.steady.states = [self.states[rid] for rid in step.sampled]
        return self.steady.states

    def finish(self, handle: StepHandle) -> ModelRunnerOutput:
        """The launched step's tokens to the host (its one device -> host copy) and into the requests."""
        if handle.tokens is None:
            return handle.result
        tokens = handle.tokens.tolist()
        logprobs = Sampler.logprobs(handle.raw_logprobs, handle.sampling, tokens)
        self._record(handle.sampled, tokens, logprobs, handle.result, handle.rows, handle.states)
        handle.tokens = None
        return handle.result

    def _pending_inputs(self, step: StepInputs, prev: StepHandle | None):  # noqa: ANN202
        """(batch positions, token ids on the device) of decodes whose input is a token of the step in
        flight, or None: the ids go from that step's samples straight into this step's inputs."""
        if step.pending is None:
            return None
        if prev is None or prev.tokens is None:
            raise RuntimeError("a step reads tokens of a step in flight, but no step is in flight")
        device = prev.tokens.device
        where = self.batch.pending_index[step.decode_rows[step.pending]]
        self.steps_reading_in_flight += 1
        if step is self.steady.step:  # every row in flight, the same rows each step: one upload of them
            if self.steady.pending is None:
                self.steady.pending = _device(step.pending, device)
            return self.steady.pending, prev.tokens[_device(where, device)]
        return _device(step.pending, device), prev.tokens[_device(where, device)]

    def _eager_logits(self, step: StepInputs, sched: dict[str, int], result: ModelRunnerOutput,
                      patch: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if step is self.steady.step and self._on_cpu:  # its tensors are views of its arrays
            cpu = self.steady.cpu_inputs(step, self.batch)
            if patch is not None:  # ids of the step in flight (the host's are one token behind)
                cpu.input_ids[patch[0]] = patch[1]
            lora = None
            if self.lora is not None and self._num_adapters:
                lora = self.lora.prepare([(self.states[rid].adapter, 1) for rid in step.order], step.num_decodes)
            hidden = self.model.hidden_states(cpu.input_ids, cpu.positions, cpu.meta, self.kv_caches, lora=lora)
            return self.model.logits(hidden, cpu.logits_rows)
        device = self.model.device
        input_ids = _device(step.input_ids, device)
        if patch is not None:
            input_ids[patch[0]] = patch[1]
        meta = AttentionMetadata(
            slot_mapping=_device(step.slots, device),
            block_size=self.block_size,
            decode_groups=decode_groups(step.decode_context, self.batch.block_table, step.decode_rows, self.block_size,
                                        device, one_group=self._one_decode_group, int32=self.model.use_kernels),
            prefills=[make_prefill_chunk(s, e, p, t, device) for s, e, p, t in step.chunks],
        )
        lora = None
        if self.lora is not None and self._num_adapters:
            lora = self.lora.prepare([(self.states[rid].adapter, sched[rid]) for rid in step.order], step.num_decodes)
        hidden = self.model.hidden_states(input_ids, _device(step.positions, device), meta, self.kv_caches, lora=lora)
        logits = self.model.logits(hidden, _device(np.asarray(
            step.logits_rows + [r for _, rows, _ in step.prompt_rows for r in rows] if step.prompt_rows
            else step.logits_rows, dtype=np.int64), device))
        if step.pool_spans:
            self._pool(hidden, step.pool_spans, result)
        return logits

    def _graph_logits(self, step: StepInputs, patch: tuple[torch.Tensor, torch.Tensor] | None,
                      ) -> torch.Tensor | None:
        """The sampled rows' logits from a decode graph, or None where the step is not decodes alone (or
        needs hidden states: pooling, prompt logprobs) or is larger than every captured size."""
        if step.chunks or step.prompt_rows or step.pool_spans or not step.num_decodes:
            return None
        slots = None
        if self.lora is not None and self._num_adapters:
            slots = self.lora.assign_rows([self.states[rid].adapter for rid in step.order])
        logits = self.graphs.run(step.input_ids, step.positions, step.slots, self.batch.block_table,
                                 step.decode_rows, step.decode_context, slots, patch)
        if logits is None or len(step.logits_rows) == step.num_decodes:
            return logits
        return logits[_device(np.asarray(step.logits_rows, dtype=np.int64), logits.device)]

    def _advance(self, step: StepInputs, sched: dict[str, int]) -> None:
        """The scheduled tokens are in the cache now."""
        batch = self.batch
        batch.num_computed[step.decode_rows] = step.decode_context  # position + 1
        for rid in step.order[step.num_decodes:]:
            batch.num_computed[self.states[rid].row] += sched[rid]

    def _sampling_batch(self, step: StepInputs) -> SamplingBatch:
        """The sampled rows' parameters, gathered from the InputBatch: nothing for what no live request
        uses (the batch's counts say), and per-row Python only for rows that need their request
        (penalties, logit bias)."""
        if step is self.steady.step:
            if self.steady.sampling is None:
                self.steady.sampling = self._gather_sampling(step)
            return self.steady.sampling
        return self._gather_sampling(step)

    def _gather_sampling(self, step: StepInputs) -> SamplingBatch:
        b, rows = self.batch, step.sampled_rows
        if b.num_random:
            out = SamplingBatch(b.temperature[rows], b.top_k[rows], b.top_p[rows], b.min_p[rows])
            seeds = b.seed[rows]
            if (seeds >= 0).any():
                out.seeds = seeds
                # the sampled token's index among the outputs: position + 1 - prompt (a decode whose input
                # is still in flight samples one past the tokens the host knows)
                out.output_index = step.positions[step.logits_rows] + 1 - b.num_prompt[rows]
        else:
            out = SamplingBatch(np.zeros(len(rows), dtype=np.float32))
        if b.num_logprobs:
            wants = b.logprobs[rows]
            out.logprobs = [(i, int(wants[i])) for i in np.flatnonzero(wants >= 0).tolist()] or None
        special = np.flatnonzero(b.special[rows]).tolist() if b.num_special else []
        if special:
            states = [self.states[step.sampled[i]] for i in special]
            out.bias = bias_entries([(i, st.params.logit_bias) for i, st in zip(special, states, strict=True)
                                     if st.params.logit_bias])
            out.penalties = [(i, SamplingRow(st.params, st.token_ids, st.num_prompt_tokens))
                             for i, st in zip(special, states, strict=True) if st.params.needs_penalties] or None
        out.all_greedy = not b.num_random and out.bias is None and not out.penalties
        return out

    def _rows_one_by_one(self, sampled: list[str], spec: dict[str, list[int]]) -> list[SamplingRow]:
        """Sampling rows of a step with draft verifications: a verification's j-th row follows its first j drafts."""
        rows = []
        seen: dict[str, int] = {}
        for rid in sampled:
            st = self.states[rid]
            j = seen[rid] = seen.get(rid, -1) + 1
            rows.append(SamplingRow(st.params, st.token_ids + spec[rid][:j] if j else st.token_ids,
                                    st.num_prompt_tokens))
        return rows

    def _record(self, sampled: list[str], tokens: list[int], logprobs: list[TokenLogprobs | None],
                result: ModelRunnerOutput, sampled_rows: np.ndarray | None,
                launched: list[RunnerRequestState] | None = None) -> None:
        """Append each sampled token to its request (runner state and InputBatch row) and to the result.
        `sampled_rows`: the InputBatch rows of `sampled`, when known; `launched`: their states when the
        step was launched (a request finished, aborted or preempted since then is skipped: its row may
        already be another request's)."""
        states, batch, failed = self.states, self.batch, result.failed_request_ids
        out_tokens, out_logprobs = result.sampled_token_ids, result.logprobs
        rows, kept = [], []
        for i, (rid, tok, lp) in enumerate(zip(sampled, tokens, logprobs, strict=True)):
            st = states.get(rid)
            if st is None or (launched is not None and st is not launched[i]) or (failed and rid in failed):
                continue
            if st.matcher is not None and not st.matcher.accept(tok):
                failed[rid] = (f"{st.params.structured.source}: the grammar refused token {tok} "
                               "(no token it allows was left to sample)")
                continue
            st.token_ids.append(tok)
            rows.append(st.row)
            kept.append(tok)
            out_tokens[rid] = [tok]
            if lp is not None:
                out_logprobs[rid] = [lp]
        if not rows:
            return
        idx = sampled_rows if sampled_rows is not None and len(rows) == len(sampled) else np.asarray(rows)
        batch.last_token[idx] = kept
        num_tokens = batch.num_tokens
        num_tokens[idx] = num_tokens[idx] + 1  # not `+=` on the fancy index: ~0.5 µs less a step

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
            row = st.row
            self.batch.last_token[row] = emitted[-1]
            self.batch.num_tokens[row] += len(emitted)
            self.batch.num_computed[row] -= n - len(emitted)  # rejected drafts' slots: overwritten next step
            result.sampled_token_ids[rid] = emitted
            if logprobs[i] is not None:
                result.logprobs[rid] = logprobs[i : i + len(emitted)]
            i += n
        return rest

def _device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step input on the model's device: the numpy array itself on the CPU (no copy); on CUDA through
    pinned memory, asynchronously (the caching host allocator keeps the pinned block until the copy ran)."""
    t = torch.from_numpy(array)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _needs_host(params: SamplingParams) -> bool:
    """Whether a request's every step needs the previous step's tokens on the host (ModelRunner.needs_host)."""
    return bool(params.structured is not None or params.needs_penalties or params.speculative_tokens
                or params.prompt_logprobs is not None or params.pooling is not None)
