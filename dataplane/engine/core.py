"""The engine core: owns the model, the scheduler and the runner; one `step()` is one forward pass."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from dataplane.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from dataplane.distributed.launch import start_tensor_parallel
from dataplane.engine.output_processor import OutputProcessor
from dataplane.kv_cache.manager import KVCacheManager
from dataplane.kv_cache.second_tier import SecondTier
from dataplane.lora.manager import AdapterInfo, LoRAManager, LoRAStats
from dataplane.models.loader import LoadedModel, load_configured
from dataplane.outputs import RequestOutput
from dataplane.request import Request, RequestStatus
from dataplane.runner.model_runner import ModelRunner, StepHandle
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from dataplane.scheduler.scheduler import Scheduler
from dataplane.stats import SchedulerStats
from dataplane.structured.backend import DEFAULT_COMPILE_TIMEOUT, GrammarBackend

log = logging.getLogger(__name__)

PromptInput = str | list[int]


@dataclass(slots=True)
class MemoryReport:
    weight_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int  # 2 x layers x kv_heads x head_dim x dtype bytes
    num_blocks: int
    block_size: int
    kv_cache_dtype: str = "auto"  # what the cache holds: "fp8", or the model's dtype's name ("bfloat16", ...)

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks * self.block_size


class EngineCore:
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, scheduler_config: SchedulerConfig,
                 progress: bool = True, preloaded: LoadedModel | None = None,
                 lora_config: LoRAConfig | None = None,
                 grammar_compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT) -> None:
        self.model_config = model_config
        # `preloaded` lets several engines (tests, benchmarks) share one set of read-only weights.
        if model_config.tensor_parallel_size > 1:
            loaded = _start_tensor_parallel(model_config, progress, preloaded, lora_config)
        else:
            loaded = preloaded or load_configured(model_config, progress)
        self.model = loaded.model
        if model_config.compile_decode and getattr(self.model, "compiled", False) is None:  # not yet, and can
            self.model.enable_compiled_decode()
        self.tokenizer = loaded.tokenizer
        self.model_name = model_config.model
        self.max_model_len = min(model_config.max_model_len or loaded.args.max_position, loaded.args.max_position)
        per_token = ModelRunner.kv_bytes_per_token(self.model, cache_config.kv_cache_dtype)
        num_blocks = int(cache_config.kv_cache_memory) // (per_token * cache_config.block_size)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory: {cache_config.kv_cache_memory} bytes hold no block of "
                             f"{cache_config.block_size} tokens at {per_token} bytes per token")
        self.memory = MemoryReport(self.model.weight_bytes, num_blocks * cache_config.block_size * per_token,
                                   per_token, num_blocks, cache_config.block_size,
                                   "fp8" if cache_config.kv_cache_dtype == "fp8" else
                                   str(self.model.dtype).removeprefix("torch."))
        report = (f"{self.model_name}: weights {self.memory.weight_bytes / 2**20:.1f} MiB "
                  f"({model_config.torch_dtype}); KV cache {self.memory.kv_cache_bytes / 2**20:.1f} MiB = "
                  f"{num_blocks} blocks x {cache_config.block_size} tokens = {self.memory.kv_cache_tokens} tokens "
                  f"({per_token} bytes/token = 2 x {self.model.args.num_layers} layers x "
                  f"{self.model.args.num_kv_heads} kv heads x " + (
                      f"({self.model.args.head_dim} fp8 + 2 scale) bytes)" if cache_config.kv_cache_dtype == "fp8"
                      else f"{self.model.args.head_dim} x {self.model.embed.element_size()} bytes)"))
        log.info(report)
        if progress:
            print(report, file=sys.stderr)
        tier = None
        if cache_config.kv_offload_size:
            if model_config.tensor_parallel_size > 1:  # each rank holds its heads' share of a block
                raise ValueError("kv_offload_size: the second tier does not run with tensor_parallel_size > 1 yet")
            tier = SecondTier(int(cache_config.kv_offload_size), per_token * cache_config.block_size,
                              cache_config.kv_offload_dir)
        kv = KVCacheManager(num_blocks, cache_config.block_size, cache_config.enable_prefix_caching, tier)
        self.scheduler = Scheduler(scheduler_config, kv, self.max_model_len,
                                   max_loras=lora_config.max_loras if lora_config else None)
        # Multi-LoRA (dataplane/lora): None when the engine serves the base model only.
        self.lora = LoRAManager(lora_config, self.model, self.scheduler) if lora_config else None
        # Structured outputs: grammars compiled against this tokenizer (lazily: plain engines pay nothing),
        # each within grammar_compile_timeout seconds (None: in-process, no deadline).
        self.structured = GrammarBackend(self.tokenizer.hf, self.model.args.vocab_size, self.tokenizer.eos_token_ids,
                                         compile_timeout=grammar_compile_timeout)
        self.runner = ModelRunner(self.model, num_blocks, cache_config.block_size, model_config.seed,
                                  max_num_seqs=scheduler_config.max_num_seqs, max_model_len=self.max_model_len,
                                  kv_cache_dtype=cache_config.kv_cache_dtype, tier=tier,
                                  lora=self.lora.runtime if self.lora else None, structured=self.structured)
        mode = model_config.graph_mode
        if mode is not None:
            self.runner.use_graphs(mode, scheduler_config.max_num_seqs)
        overlap = scheduler_config.async_scheduling
        if overlap is None:
            overlap = str(model_config.device).startswith("cuda") and model_config.tensor_parallel_size == 1
        # Drafts are proposed from the tokens on the host, every step: speculation and overlap exclude each other.
        self.overlap = self.runner.overlap = bool(overlap) and not scheduler_config.speculative.ngram_tokens
        self._in_flight: tuple[SchedulerOutput, StepHandle, float] | None = None
        self.processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    # -- building requests (validates; queues nothing) -------------------------------------------
    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: must not be empty")
            return prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, list | tuple) or not prompt:
            raise ValueError("prompt: must be a non-empty string or a non-empty list of token ids")
        vocab = self.model.args.vocab_size
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        return None, list(prompt)

    def make_requests(self, prompt: PromptInput, params: SamplingParams, *, request_id: str | None = None,
                      priority: int = 0, cache_salt: str | None = None, adapter: str | None = None,
                      ) -> tuple[str, str | None, list[Request]]:
        """One engine request per completion (n of them); siblings reuse the first one's prompt blocks."""
        if not isinstance(params, SamplingParams):
            raise ValueError("params: expected SamplingParams")
        text, ids = self.tokenize(prompt)
        adapter = self._adapter_key(adapter)
        if params.structured is not None:
            self.structured.compile(params.structured)  # a bad schema is a ValueError now, not mid-step
        vocab = self.model.args.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias: token id {max(params.logit_bias)} is outside the vocabulary [0, {vocab})")
        rid = request_id or f"req-{next(self._ids)}"
        children: list[Request] = []
        for i in range(params.n):
            p = params
            if params.n > 1:
                # Prompt logprobs are the parent's, computed once: siblings keep sharing the prompt's blocks.
                p = _copy_params(params, seed=None if params.seed is None else params.seed + i,
                                 prompt_logprobs=params.prompt_logprobs if i == 0 else None)
            children.append(Request(f"{rid}#{i}" if params.n > 1 else rid, ids, p, self.tokenizer.eos_token_ids,
                                    priority, cache_salt, adapter, wait_for=children[0] if children else None))
        self.scheduler.check_admissible(children[0])
        return rid, text, children

    def add(self, request_id: str, prompt: str | None, children: list[Request]) -> None:
        if request_id in self.processor.parents:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.admit(children)
        self.processor.add(request_id, prompt, children)

    def admit(self, children: list[Request]) -> None:
        """Queue a call's engine requests (its adapter admitted first); the output side is the caller's
        (`add` registers them with this core's own processor, AsyncLLM with its loop's)."""
        if self.lora is not None:
            self.lora.admit(children[0].adapter)
        for child in children:
            self.scheduler.add_request(child)

    def abort(self, request_id: str) -> RequestOutput | None:
        self.scheduler.finish_requests(self.processor.children_of(request_id), RequestStatus.FINISHED_ABORTED)
        return self.processor.abort(request_id)

    def finish_stopped(self, stops: list[tuple[str, str]]) -> None:
        """End engine requests whose text reached a stop string (found by an output processor)."""
        for child_id, stop in stops:
            req = self.scheduler.requests.get(child_id)
            if req is not None:
                req.stop_reason = stop
            self.scheduler.finish_requests([child_id], RequestStatus.FINISHED_STOPPED)

    # -- LoRA adapters (dataplane/lora) ----------------------------------------------------------
    def _adapter_key(self, name: str | None) -> str | None:
        if name is not None and self.lora is None:
            raise ValueError("adapter: LoRA is not enabled on this engine (enable_lora=True)")
        return self.lora.resolve(name) if self.lora is not None else None

    def _lora(self) -> LoRAManager:
        if self.lora is None:
            raise ValueError("adapter: LoRA is not enabled on this engine (enable_lora=True)")
        return self.lora

    def add_adapter(self, name: str, path: str) -> None:
        """Parse, validate and register an adapter (the offline API; AsyncLLM parses off the step thread)."""
        lora = self._lora()
        lora.register(lora.load(name, path))

    def remove_adapter(self, name: str) -> None:
        """Unregister an adapter; refused while requests use it."""
        self._lora().remove(name)

    def list_adapters(self) -> list[AdapterInfo]:
        return self.lora.list() if self.lora is not None else []

    def lora_stats(self) -> LoRAStats | None:
        return self.lora.stats() if self.lora is not None else None

    # -- one step ------------------------------------------------------------------------------
    def step(self, delta: bool = False, final_only: bool = False) -> list[RequestOutput]:
        """One forward pass, its outputs processed here (the offline API). `delta`: outputs carry what is
        new since the last step (streaming); `final_only`: outputs only for requests that finished."""
        return self.process(self.step_core(), delta, final_only)

    def step_core(self) -> list[EngineCoreOutput]:
        """One forward pass: schedule, execute, update. Token ids out, nothing detokenized: AsyncLLM
        turns them into text on its event loop, off this step's critical path. With overlapped
        scheduling the outputs are those of the step launched by the previous call."""
        if self.overlap:
            return self._step_overlapped()
        out = self.scheduler.schedule()
        try:
            t0 = time.perf_counter()
            result = self.runner.execute(out)
            self.scheduler.observe_step(out.total_num_scheduled_tokens, time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - one bad step must not take the engine down
            result = _failed(out, exc)
        return self._update(out, result)

    def _update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        core_outputs = self.scheduler.update(out, result)
        if result.pooled:  # embeddings finish in update (max_tokens 0); their vector rides on that output
            for o in core_outputs:
                o.embedding = result.pooled.get(o.request_id)
        return core_outputs

    # -- overlapped scheduling ------------------------------------------------------------------
    def _step_overlapped(self) -> list[EngineCoreOutput]:
        """Schedule and launch step N+1, then bring step N's tokens to the host and update: on a GPU the
        host's scheduling and input building for N+1 run while the device still computes N, and N+1
        reads N's tokens on the device. The scheduler counts N's tokens as computed and its samples as
        pending at launch (Scheduler.advance). A request that N finishes (EOS, length) has N+1's token
        for it dropped in N+1's update; one that needs every token on the host (a grammar, penalties,
        drafts, prompt logprobs, pooling) makes every step synchronous while it runs."""
        prev, self._in_flight = self._in_flight, None
        outputs: list[EngineCoreOutput] = []
        if prev is not None and self.runner.needs_host:
            outputs, prev = self._settle(prev), None
        out = self.scheduler.schedule()
        if out.is_empty:
            self.runner.launch(out)  # hands the runner the finished requests to drop
            return outputs + (self._settle(prev) if prev is not None else [])
        t0 = time.perf_counter()
        try:
            handle = self.runner.launch(out, prev[1] if prev is not None else None)
        except Exception as exc:  # noqa: BLE001 - one bad step must not take the engine down
            if prev is not None:
                outputs += self._settle(prev)
            return outputs + self._update(out, _failed(out, exc))
        self.scheduler.advance(out)
        if prev is not None:
            outputs += self._settle(prev)
        flight = (out, handle, t0)
        if self.runner.needs_host:
            outputs += self._settle(flight)
        else:
            self._in_flight = flight
        return outputs

    def _settle(self, flight: tuple[SchedulerOutput, StepHandle, float]) -> list[EngineCoreOutput]:
        out, handle, t0 = flight
        try:
            result = self.runner.finish(handle)
            self.scheduler.observe_step(out.total_num_scheduled_tokens, time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - a device error surfaces here, at the copy of the tokens
            result = _failed(out, exc)
        return self._update(out, result)

    def process(self, core_outputs: list[EngineCoreOutput], delta: bool = False,
                final_only: bool = False) -> list[RequestOutput]:
        outputs, stops = self.processor.process(core_outputs, delta, final_only)
        if stops:
            self.finish_stopped(stops)
        return outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def close(self) -> None:
        """Stop what the engine started outside this process (tensor-parallel ranks); idempotent."""
        close = getattr(self.model, "close", None)
        if close is not None:
            close()
        if self.scheduler.kv.tier is not None:
            self.scheduler.kv.tier.close()

    def stats(self) -> SchedulerStats:
        stats = self.scheduler.stats()
        graphs = self.runner.graphs
        if graphs is not None and graphs.mode == "cuda":
            g = graphs.stats
            stats.cuda_graphs, stats.cuda_graph_capture_seconds = g.graphs, g.capture_seconds
            stats.cuda_graph_memory_bytes, stats.cuda_graph_replays = g.memory_bytes, g.replays
        return stats


def _failed(out: SchedulerOutput, exc: Exception) -> ModelRunnerOutput:
    log.error("model step failed; failing its %d requests", len(out.num_scheduled_tokens), exc_info=exc)
    return ModelRunnerOutput(failed_request_ids={rid: f"engine error: {exc}" for rid in out.num_scheduled_tokens})


def _start_tensor_parallel(model_config: ModelConfig, progress: bool, preloaded: LoadedModel | None,
                           lora_config: LoRAConfig | None) -> LoadedModel:
    if preloaded is not None:
        raise ValueError("tensor_parallel_size: a preloaded model cannot be split; each rank loads its own shard")
    if lora_config is not None:
        raise ValueError("enable_lora: LoRA is not supported with tensor_parallel_size > 1")
    return start_tensor_parallel(model_config, progress)


def _copy_params(params: SamplingParams, **changes: Any) -> SamplingParams:
    values = {name: getattr(params, name) for name in SamplingParams.__dataclass_fields__}
    values.update(changes)
    values["n"] = 1
    return SamplingParams(**values)
