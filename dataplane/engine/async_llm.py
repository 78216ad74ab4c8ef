"""The asynchronous API: `AsyncLLM.generate(...)` yields deltas; the step loop runs on its own thread.

The engine thread owns the EngineCore's scheduler, runner and model outright. Callers talk to it only
through a command queue (add, abort, stop) and receive outputs through per-request asyncio queues, so
no caller's event loop ever waits on a model step.

The engine thread's step ends at token ids (`EngineCore.step_core`): detokenization, stop strings and
the `RequestOutput`s happen on the caller's event loop, one callback per step for the whole batch
(its own `OutputProcessor`), off the step's critical path. A stop string is therefore seen after the
step that completed it; the engine may run one or two more steps for that request before the "stop"
command ends it, and the processor drops those tokens (it has already finished the request), so no
client and no usage count ever sees them.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from dataplane.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from dataplane.engine import kv_transfer
from dataplane.engine.core import EngineCore, PromptInput
from dataplane.engine.load_curve import measure_load_curve
from dataplane.engine.output_processor import OutputProcessor
from dataplane.engine.passing_thread import in_passing_thread
from dataplane.engine.warmup import WarmupReport, warm_up
from dataplane.errors import QueueFullError
from dataplane.lora.manager import AdapterInfo, LoRAStats
from dataplane.models.loader import LoadedModel
from dataplane.outputs import RequestOutput
from dataplane.request import RequestStatus
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.fairness import assign_tenant
from dataplane.scheduler.output import EngineCoreOutput
from dataplane.spec_decode.config import SpeculativeConfig
from dataplane.stats import SchedulerStats
from dataplane.structured.backend import DEFAULT_COMPILE_TIMEOUT

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    children: list[str]  # the engine requests of this call (n > 1 siblings)


class AsyncLLM:
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig | None = None,
                 scheduler_config: SchedulerConfig | None = None, progress: bool = True,
                 preloaded: LoadedModel | None = None, lora_config: LoRAConfig | None = None,
                 grammar_compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT) -> None:
        self.core = EngineCore(model_config, cache_config or CacheConfig(), scheduler_config or SchedulerConfig(),
                               progress, preloaded, lora_config, grammar_compile_timeout)
        self.tokenizer = self.core.tokenizer
        self.model_name = model_config.model
        self.max_model_len = self.core.max_model_len
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}  # by the caller's request id (event loop threads)
        self._loops: dict[str, asyncio.AbstractEventLoop] = {}  # engine request -> its caller's loop
        self._processors: dict[asyncio.AbstractEventLoop, OutputProcessor] = {}  # one per caller loop
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self.latest_stats: SchedulerStats = self.core.stats()
        self.latest_lora_stats: LoRAStats | None = self.core.lora_stats()
        self._thread = threading.Thread(target=self._loop, name="tessera-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_args(cls, model: str, **kwargs: Any) -> AsyncLLM:
        mc = {k: kwargs.pop(k) for k in ("dtype", "weight_dtype", "device", "max_model_len", "seed",
                                         "tensor_parallel_size", "compile_decode", "quantization", "cuda_graphs",
                                         "int4_dense_above")
              if k in kwargs}
        cc = {k: kwargs.pop(k) for k in ("block_size", "kv_cache_memory", "enable_prefix_caching", "kv_cache_dtype",
                                         "kv_offload_size", "kv_offload_dir")
              if k in kwargs}
        sc = {k: kwargs.pop(k) for k in ("max_num_seqs", "max_num_batched_tokens", "max_waiting", "aging_seconds",
                                         "long_prefill_token_threshold", "itl_guard_priority", "itl_guard_tokens", "itl_guard_seqs",
                                         "itl_guard_step_tokens", "itl_guard_step_ms", "background_priority", "background_step_ms",
                                         "fair_share", "async_scheduling")
              if k in kwargs}
        sc["speculative"] = SpeculativeConfig.pop_from(kwargs)
        lc = {k: kwargs.pop(k) for k in ("max_loras", "max_lora_rank", "max_cpu_loras") if k in kwargs}
        lora = LoRAConfig(**lc) if kwargs.pop("enable_lora", False) else None
        return cls(ModelConfig(model=model, **mc), CacheConfig(**cc), SchedulerConfig(**sc), lora_config=lora,
                   **kwargs)

    # -- the caller's side ---------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self.latest_stats.num_waiting

    async def generate(self, prompt: PromptInput, params: SamplingParams, *, request_id: str | None = None,
                       priority: int = 0, cache_salt: str | None = None, adapter: str | None = None,
                       tenant: str | None = None, tenant_weight: float = 1.0,
                       ) -> AsyncIterator[RequestOutput]:
        """Yield deltas (new text, token ids, logprobs per completion) until the request finishes.

        Bad input raises ValueError here, before anything is queued. Leaving the iterator early
        (a client disconnect) aborts the request and frees its KV blocks within one step.
        """
        if self._error is not None or self._stopped.is_set():
            raise EngineDeadError(f"engine is not running: {self._error!r}")
        if params.structured is not None:
            # Compile off the event loop (a large schema takes milliseconds to seconds); cached after.
            await asyncio.to_thread(self.core.structured.compile, params.structured)
        rid, text, children = self.core.make_requests(prompt, params, request_id=request_id or uuid.uuid4().hex,
                                                      priority=priority, cache_salt=cache_salt, adapter=adapter)
        assign_tenant(children, tenant, tenant_weight)  # fair sharing within the priority (scheduler/fairness.py)
        limit = self.core.scheduler.config.max_waiting
        waiting = self.core.scheduler.num_waiting
        if limit is not None and waiting + len(children) > limit:
            raise QueueFullError(f"{waiting} requests are waiting (limit {limit})")
        if rid in self._streams:
            raise ValueError(f"request_id: {rid!r} is already running")
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, asyncio.Queue(), [c.request_id for c in children])
        self._streams[rid] = stream
        processor = self._processors.get(loop)
        if processor is None:
            processor = self._processors[loop] = OutputProcessor(self.tokenizer)
        processor.add(rid, text, children)
        for child in stream.children:
            self._loops[child] = loop
        self._send("add", (rid, children))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._streams.pop(rid, None)
            processor.forget(rid)
            if not finished:
                self._send("abort", stream.children)

    def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            self._send("abort", stream.children)

    # -- LoRA adapters: parsed on a worker thread, registered on the engine thread ---------------
    async def add_adapter(self, name: str, path: str) -> None:
        """Load a PEFT adapter; reading and checking it never holds up the step loop. ValueError if bad."""
        lora = self.core.lora
        if lora is None:
            raise ValueError("adapter: LoRA is not enabled on this engine (enable_lora=True)")
        adapter = await in_passing_thread(lora.load, name, path, thread_name="tessera-adapter-load")
        await self._call(lambda: lora.register(adapter))

    async def remove_adapter(self, name: str) -> None:
        """Unload an adapter; ValueError if unknown or in use by requests."""
        await self._call(lambda: self.core.remove_adapter(name))

    async def list_adapters(self) -> list[AdapterInfo]:
        return await self._call(self.core.list_adapters)

    async def warm_up(self) -> WarmupReport:
        """Run the start-up warm-up (engine/warmup.py) on the engine thread; call before serving."""
        return await self._call(lambda: warm_up(self.core))

    async def measure_load_curve(self) -> dict:
        """The step-cost sweep (engine/load_curve.py) on the engine thread; after warm_up, before serving."""
        return await self._call(lambda: measure_load_curve(self.core))

    # -- KV blocks by prefix, for prefill/decode disaggregation (engine/kv_transfer.py) -----------
    @property
    def has_second_tier(self) -> bool:
        return self.core.scheduler.kv.tier is not None

    def kv_layout(self) -> tuple[bytes, int]:
        return kv_transfer.layout(self.core)  # fixed at construction: no need for the engine thread

    async def wanted_blocks(self, token_ids: list[int], cache_salt: str | None) -> tuple[int, list[bytes]]:
        return await self._call(lambda: kv_transfer.wanted_blocks(self.core, token_ids, cache_salt))

    async def export_prefix(self, token_ids: list[int], cache_salt: str | None, skip: int = 0
                            ) -> list[tuple[bytes, bytes]]:
        return await self._call(lambda: kv_transfer.export_prefix(self.core, token_ids, cache_salt, skip))

    async def import_blocks(self, blocks: list[tuple[bytes, bytes]]) -> int:
        # The tier is thread-safe; writing to it on a thread of its own keeps the engine stepping meanwhile.
        return await asyncio.to_thread(kv_transfer.import_blocks, self.core, blocks)

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread between steps; its result or exception comes back here."""
        if self._error is not None or self._stopped.is_set():
            raise EngineDeadError(f"engine is not running: {self._error!r}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._send("call", (fn, loop, future))
        return await future

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout)
        self.core.structured.close()
        if not self._thread.is_alive():  # a step still running would share the ranks' channel with the stop
            self.core.close()

    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def _send(self, kind: str, payload: Any) -> None:
        self._commands.put((kind, payload))
        self._wake.set()

    # -- the caller's event loop: outputs -----------------------------------------------------
    def _on_outputs(self, loop: asyncio.AbstractEventLoop, core_outputs: list[EngineCoreOutput]) -> None:
        """One step's token ids for this loop's requests: detokenize, match stop strings, hand out."""
        processor = self._processors.get(loop)
        if processor is None:
            return
        outputs, stops = processor.process(core_outputs, delta=True)
        streams = self._streams
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is not None:
                stream.queue.put_nowait(out)
        if stops:
            self._send("stop", stops)

    # -- the engine thread -------------------------------------------------------------------
    def _deliver(self, rid: str, item: BaseException) -> None:
        stream = self._streams.get(rid)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _hand_out(self, core_outputs: list[EngineCoreOutput]) -> None:
        """A step's outputs to their callers' loops: one callback per loop, not one per request."""
        loops = self._loops
        by_loop: dict[asyncio.AbstractEventLoop, list[EngineCoreOutput]] = {}
        for o in core_outputs:
            loop = loops.get(o.request_id)
            if loop is None:
                continue
            if o.finish_reason is not None:
                loops.pop(o.request_id, None)
            batch = by_loop.get(loop)
            if batch is None:
                by_loop[loop] = [o]
            else:
                batch.append(o)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._on_outputs, loop, batch)
            except RuntimeError:  # that loop was closed: its callers are gone
                pass

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                rid, children = payload
                try:
                    self.core.admit(children)
                except (ValueError, QueueFullError) as exc:
                    for child in children:
                        self._loops.pop(child.request_id, None)
                    self._deliver(rid, exc)
            elif kind == "abort":
                self.core.scheduler.finish_requests(payload, RequestStatus.FINISHED_ABORTED)
                for child in payload:
                    self._loops.pop(child, None)
            elif kind == "stop":
                self.core.finish_stopped(payload)
                for child, _ in payload:
                    self._loops.pop(child, None)
            elif kind == "call":
                fn, loop, future = payload
                try:
                    result, error = fn(), None
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    result, error = None, exc
                self._snapshot_stats()  # callers read adapter lists from the snapshot right after
                loop.call_soon_threadsafe(_settle, future, result, error)

    def _snapshot_stats(self) -> None:
        self.latest_stats = self.core.stats()
        if self.core.lora is not None:
            self.latest_lora_stats = self.core.lora_stats()

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                self._drain_commands()
                if not self.core.has_unfinished():
                    self._snapshot_stats()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                self._hand_out(self.core.step_core())
                self._snapshot_stats()
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting caller
            log.exception("engine loop died")
            self._error = exc
            for rid in list(self._streams):
                self._deliver(rid, EngineDeadError(f"engine loop died: {exc!r}"))
            self._fail_calls(EngineDeadError(f"engine loop died: {exc!r}"))

    def _fail_calls(self, error: BaseException) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                _, loop, future = payload
                loop.call_soon_threadsafe(_settle, future, None, error)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
