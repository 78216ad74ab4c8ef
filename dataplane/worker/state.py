"""What the worker's routes share: the engine once loaded, metrics, usage memory, the drainer.

Its own module so that the routes (routes.py, adapters.py), the server and the agent all depend on it
and it on none of them.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

from dataplane.engine.async_llm import AsyncLLM
from dataplane.engine.passing_thread import in_passing_thread
from dataplane.worker import adapters
from dataplane.worker.config import WorkerConfig
from dataplane.worker.disaggregation import PrefillClient
from dataplane.worker.drain import Drainer
from dataplane.worker.metrics import WorkerMetrics
from dataplane.worker.openai_request import Serving
from dataplane.worker.usage_memory import UsageMemory

log = logging.getLogger("tessera.worker")


class WorkerState:
    """What the routes share: the engine once loaded, metrics, the drainer."""

    def __init__(self, config: WorkerConfig, engine: AsyncLLM | None = None) -> None:
        self.config = config
        self.engine: AsyncLLM | None = None
        self.serving: Serving | None = None
        self.load_error: BaseException | None = None
        self.load_curve: dict | None = None  # the engine's measured step costs (engine/load_curve.py)
        self.drainer = Drainer()
        self.usage = UsageMemory(config.usage_memory_entries, config.usage_memory_seconds)  # counts by request id
        self.metrics = WorkerMetrics(config.model_id, lambda: self.engine.latest_stats if self.engine else None)
        adapters.register_metrics(self)
        self.created = int(time.time())
        self.on_fatal: Callable[[], None] = lambda: None  # the server's way out when loading fails
        if engine is not None:  # tests: a ready engine, no heap to settle
            self.attach(engine, freeze=False)

    def attach(self, engine: AsyncLLM, freeze: bool = True) -> None:
        self.engine = engine
        self.serving = Serving(engine, self.config, self.metrics, self.usage)
        c = self.config
        if c.prefill_url:
            self.serving.prefill = PrefillClient(engine, c.prefill_url.split(","), c.token, c.prefill_min_tokens,
                                                 c.prefill_timeout, self.metrics)
        if not freeze:
            return
        # The model leaves ~200k long-lived objects; a full collection scanning them holds the GIL for
        # ~0.2 s here, stalling the engine thread. Collect once now, then exempt them (gc.freeze).
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    async def load(self) -> None:
        started = time.monotonic()
        try:
            engine = await in_passing_thread(AsyncLLM.from_args, self.config.model, thread_name="tessera-load",
                                             **self.config.engine_kwargs())
        except Exception as exc:  # noqa: BLE001 - a worker that cannot load must exit, loudly
            log.exception("model failed to load", extra={"model": self.config.model})
            self.load_error = exc
            self.on_fatal()
            return
        if self.config.warmup:  # still "loading" meanwhile: /ready says 503 until the shapes are built
            await warm_up(engine)
            if self.config.load_curve:
                self.load_curve = await measure_load_curve(engine)
        self.attach(engine)
        log.info("model loaded", extra={"model": self.config.model, "seconds": round(time.monotonic() - started, 1),
                                        "max_model_len": engine.max_model_len,
                                        "kv_cache_blocks": engine.core.memory.num_blocks})

    def status(self) -> str:
        if self.load_error is not None or (self.engine is not None and not self.engine.is_alive()):
            return "dead"
        if self.engine is None:
            return "loading"
        return "draining" if self.drainer.draining else "ready"


async def measure_load_curve(engine: AsyncLLM) -> dict | None:
    """The engine's load curve, measured once warm (a failure costs only the capacity planner its
    input, so it is logged and the worker serves)."""
    try:
        curve = await engine.measure_load_curve()
    except Exception:  # noqa: BLE001 - planning input, never a reason not to serve
        log.exception("load curve sweep failed; serving without one")
        return None
    log.info("load curve measured", extra={"seconds": curve["sweep_seconds"], "decode": curve["decode"],
                                           "prefill": curve["prefill"]})
    return curve


async def warm_up(engine: AsyncLLM) -> None:
    """Build the batch shapes a worker will see (engine/warmup.py) before it serves; a failure only
    costs the first tenants that speed, so it is logged and the engine serves cold."""
    try:
        report = await engine.warm_up()
        log.info("engine warmed up", extra={"seconds": round(report.seconds, 1), "steps": report.steps,
                                            "prefill_sizes": report.prefill_sizes})
    except Exception:  # noqa: BLE001 - a cold engine still serves, only slower at first
        log.exception("engine warm-up failed; serving without it")
