"""The one engine this worker process serves, as the control plane assigned it (a deferred load).

The worker starts idle: `/health` answers, `/ready` says 503, and nothing loads until a
`load_model` task arrives. Loading builds a fresh `AsyncLLM` off the event loop (in the task's
thread), runs the quality gate for quantized replicas, then swaps it into the `WorkerState` on
the event loop's thread, so requests see either the old engine or the new one, never half of one.
Unloading first takes the engine out of the state (new requests get 503 and the gateway tries
another worker), lets in-flight requests finish (up to the grace period), then shuts it down.

Idempotency: a load for the replica (uid) whose engine is already serving with the same spec
loads nothing; it only adopts the newer attempt number.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dataplane.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from dataplane.engine.async_llm import AsyncLLM, EngineDeadError
from dataplane.engine.passing_thread import call_in_passing_thread
from dataplane.models.registry import resolve_model_path
from dataplane.quantize.gate import quality_gate
from dataplane.worker.adapter_root import OutsideAdapterRoot, resolve_in_root
from dataplane.worker.metrics import WorkerMetrics
from dataplane.worker.routes import WorkerState
from dataplane.worker.state import measure_load_curve, warm_up

log = logging.getLogger("tessera.worker.agent")

# Errors that say the spec cannot work (bad source, bad settings): retrying the same spec cannot help.
PERMANENT_ERRORS = (ValueError, TypeError, KeyError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                    PermissionError, ImportError)
MODEL_CONFIG = ("dtype", "device", "max_model_len", "seed", "tensor_parallel_size", "compile_decode", "int4_dense_above")
# quantization="gguf" keeps the file's 4-bit blocks for decode steps of up to this many rows (one fused
# C++ call at batch 1) and a dense copy above, where the blocks' kernel is the slower: on a 2-core AVX-512
# BF16 EPYC, 297 tok/s at batch 1 and 952 at 32 concurrent, against 94 / 931 for bf16 alone
# (python -m benchmarks.decode_latency). A deployment's engine_args.int4_dense_above overrides it.
GGUF_DENSE_ABOVE = 8
CACHE_CONFIG = ("block_size", "kv_cache_memory", "enable_prefix_caching", "kv_cache_dtype", "kv_offload_size")
SCHEDULER_CONFIG = ("max_num_seqs", "max_num_batched_tokens", "max_waiting")


class LoadError(Exception):
    """`reason`: for operators (may name paths); `kind`: for adapters, what the tenant is told
    (not_found / invalid / too_large / error, the control plane's fixed sentences)."""

    def __init__(self, reason: str, *, permanent: bool, gate: dict | None = None, kind: str = "error") -> None:
        super().__init__(reason)
        self.reason, self.permanent, self.gate, self.kind = reason, permanent, gate, kind


@dataclass(slots=True)
class Loaded:
    replica_uid: str
    attempt: int
    served_name: str
    source: str
    fingerprint: str
    load_seconds: float
    gate: dict | None
    load_curve: dict | None = None  # engine/load_curve.py, measured after the warm-up


def fingerprint(spec: dict) -> str:
    """What the engine was built from: a load with the same fingerprint for the same replica is a no-op."""
    keys = {k: spec.get(k) for k in ("served_name", "engine_quantization", "engine_args", "max_adapters")}
    keys["source"] = spec["model"]["source"]
    return json.dumps(keys, sort_keys=True, default=str)


class EngineSlot:
    def __init__(self, state: WorkerState, *, unload_grace_seconds: float = 30.0,
                 model_cache: Path | None = None, adapter_root: str = "") -> None:
        self.state = state
        # The worker flag (engine_args override it); a state without a config (a test's stand-in) means auto.
        self.default_tool_call_parser = getattr(getattr(state, "config", None), "tool_call_parser", "auto")
        self.adapter_root = adapter_root
        self.unload_grace_seconds = unload_grace_seconds
        self.model_cache = model_cache or Path("~/.cache/tessera/models").expanduser()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.loaded: Loaded | None = None
        self.loading: dict | None = None  # {"replica_uid", "attempt", "since"} while a load runs
        self.counters = {"engine_builds": 0, "engine_shutdowns": 0, "load_failures": 0, "adapter_loads": 0,
                         "adapter_unloads": 0}
        self._adapters: set[str] = set()

    # --- what the heartbeat reports ---------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        loading, loaded, engine = self.loading, self.loaded, self.state.engine
        if loading is not None:
            return {"state": "loading", "replica_uid": loading["replica_uid"], "attempt": loading["attempt"]}
        if loaded is None:
            return {"state": "idle"}
        alive = engine is not None and engine.is_alive()
        snap = {"state": "ready" if alive else "dead", "replica_uid": loaded.replica_uid, "attempt": loaded.attempt,
                "served_name": loaded.served_name, "load_seconds": loaded.load_seconds, "gate": loaded.gate}
        if not alive:
            snap["error"] = repr(getattr(engine, "_error", None))
        return snap

    def adapters(self) -> list[str]:
        """The adapters this agent loaded (in a managed worker nothing else adds any)."""
        return sorted(self._adapters)

    # --- model ------------------------------------------------------------------------------------
    def ensure_model(self, spec: dict) -> str:
        """Make this worker serve `spec` -> "loaded" | "already-loaded"; LoadError when it cannot."""
        fp = fingerprint(spec)
        with self.lock:
            loaded, engine = self.loaded, self.state.engine
            if (loaded is not None and loaded.replica_uid == spec["uid"] and loaded.fingerprint == fp
                    and engine is not None and engine.is_alive()):
                loaded.attempt = spec["attempt"]
                return "already-loaded"
            self.loading = {"replica_uid": spec["uid"], "attempt": spec["attempt"], "since": time.time()}
            try:
                self._unload_locked()
                started = time.monotonic()
                source = self.resolve_source(spec["model"]["source"])
                # Torch work here runs on threads that exit: a task thread that lives on would keep an
                # OpenMP pool and halve the engine's decode speed (dataplane/engine/passing_thread.py).
                gate = call_in_passing_thread(self.quality_gate, spec, source, thread_name="tessera-gate")
                engine = call_in_passing_thread(self._build, source, spec, thread_name="tessera-load")
                curve = self._warm_up(engine)
                self._call_on_loop(self._attach, engine, source, spec["served_name"],
                                   (spec.get("engine_args") or {}).get("tool_call_parser"))
                self.loaded = Loaded(spec["uid"], spec["attempt"], spec["served_name"], source, fp,
                                     round(time.monotonic() - started, 3), gate, curve)
                log.info("model loaded", extra={"replica_uid": spec["uid"], "served_name": spec["served_name"],
                                                "source": source, "seconds": self.loaded.load_seconds})
                return "loaded"
            except LoadError:
                self.counters["load_failures"] += 1
                raise
            finally:
                self.loading = None

    def unload(self, replica_uid: str | None = None) -> bool:
        """Unload the engine (only if it serves `replica_uid`, when given) -> whether anything was unloaded."""
        with self.lock:
            if self.loaded is None or (replica_uid is not None and self.loaded.replica_uid != replica_uid):
                return False
            self._unload_locked()
            return True

    def _unload_locked(self) -> None:
        engine = self._call_on_loop(self._detach)
        self.loaded = None
        self.state.load_curve = None  # the next model's steps cost what they cost
        self._adapters.clear()
        if engine is None:
            return
        deadline = time.monotonic() + self.unload_grace_seconds
        while self.state.drainer.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.shutdown()
        self.counters["engine_shutdowns"] += 1
        # Requests still streaming after the grace period end now rather than wait forever.
        for rid in list(getattr(engine, "_streams", {})):
            engine._deliver(rid, EngineDeadError("the model was unloaded"))
        log.info("model unloaded")

    def resolve_source(self, source: str) -> str:
        """A package alias or local path, checked now so that a bad one fails with a clear reason."""
        parsed = urlparse(source)
        if parsed.scheme == "file":
            source = parsed.path
        elif parsed.scheme and len(parsed.scheme) > 1:
            cached = self.model_cache / parsed.scheme / parsed.netloc / parsed.path.lstrip("/")
            if not cached.exists():
                raise LoadError(f"model source {source!r}: not in this worker's model cache ({cached}); the worker "
                                "does not download models: sync the object there first", permanent=True)
            source = str(cached)
        try:
            resolve_model_path(source)
        except ValueError as exc:
            raise LoadError(f"model source {source!r} cannot be loaded here: {exc}", permanent=True) from None
        return source

    def quality_gate(self, spec: dict, source: str) -> dict | None:
        """Quantized replicas, and replicas on an FP8 KV cache, serve only after dataplane.quantize.gate passes
        them: the weights' gate, then the cache's."""
        weights = self._weights_gate(spec, source)
        args = {**self.state.config.engine_kwargs(), **(spec.get("engine_args") or {})} \
            if getattr(self.state, "config", None) is not None else dict(spec.get("engine_args") or {})
        if args.get("kv_cache_dtype", "auto") == "auto":
            return weights
        cache = self._kv_cache_gate(spec, source, args)
        if weights is None:
            return cache
        return {"passed": True, "reason": f"{weights['reason']}; kv cache: {cache['reason']}", "kv_cache": cache}

    def _kv_cache_gate(self, spec: dict, source: str, args: dict) -> dict:
        """The model as it will serve (weights' quantization included) with the FP8 cache, against itself
        with the cache in its dtype; a replica that fails it does not load."""
        kv = args["kv_cache_dtype"]
        method = spec.get("engine_quantization")
        at_load = method if method and source == spec["model"].get("base_source", source) else None
        try:
            report = quality_gate(source, source, kv_cache_dtype=kv, quantization=at_load,
                                  dtype=args.get("dtype") or "auto")
        except Exception as exc:  # noqa: BLE001 - a gate that cannot run does not pass
            raise LoadError(f"quality gate for the {kv} KV cache could not run: {exc!r}", permanent=True) from exc
        result = {"passed": bool(report.passed), "reason": str(report.reason), "kv_cache_dtype": kv}
        if not report.passed:
            raise LoadError(f"quality gate failed for the {kv} KV cache: {result['reason']}", permanent=True,
                            gate=result)
        return result

    def _weights_gate(self, spec: dict, source: str) -> dict | None:
        method = spec.get("engine_quantization")
        if not method:
            return None
        baseline = spec["model"]["base_source"]
        kwargs = {}
        if source == baseline:
            kwargs["quantization"] = method  # a dense checkpoint quantized at load (fp8)
        try:
            report = quality_gate(source, baseline, method, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a gate that cannot run does not pass
            raise LoadError(f"quality gate for {method} could not run: {exc!r}", permanent=True) from exc
        result = {"passed": bool(report.passed), "reason": str(getattr(report, "reason", ""))}
        if not report.passed:
            raise LoadError(f"quality gate failed for {method}: {result['reason']}", permanent=True, gate=result)
        return result

    def _build(self, source: str, spec: dict):
        args = {**self.state.config.engine_kwargs(), **(spec.get("engine_args") or {})}
        args.pop("progress", None)
        if spec.get("engine_quantization") == "gguf" and "int4_dense_above" not in (spec.get("engine_args") or {}) \
                and not args.get("int4_dense_above"):
            args["int4_dense_above"] = GGUF_DENSE_ABOVE
        extra: dict[str, Any] = {}
        self.counters["engine_builds"] += 1
        try:
            if spec.get("max_adapters"):
                extra["lora_config"] = self._lora_config(spec, args)
            model = ModelConfig(model=source, quantization=spec.get("engine_quantization"),
                                **{k: args[k] for k in MODEL_CONFIG if k in args})
            cache = CacheConfig(**{k: args[k] for k in CACHE_CONFIG if k in args})
            scheduler = SchedulerConfig(**{k: args[k] for k in SCHEDULER_CONFIG if k in args})
            return AsyncLLM(model, cache, scheduler, progress=False, **extra)
        except LoadError:
            raise
        except PERMANENT_ERRORS as exc:
            raise LoadError(f"cannot load {source!r}: {exc}", permanent=True) from exc
        except Exception as exc:  # noqa: BLE001 - out of memory, a driver error...: worth another attempt
            raise LoadError(f"loading {source!r} failed: {exc!r}", permanent=False) from exc

    def _warm_up(self, engine) -> dict | None:
        """Build the batch shapes before the replica reports ready, as a worker that loads its model at
        start-up does (WorkerState.load): the heartbeat says "loading" meanwhile, so the gateway routes
        nothing here and the first tenants do not pay oneDNN's per-shape kernel builds. Then measure the
        load curve (-> it, reported with "ready"), unless the worker was started with --no-load-curve."""
        config = getattr(self.state, "config", None)
        if not getattr(config, "warmup", False):
            return None
        asyncio.run(warm_up(engine))  # a task thread: no event loop of its own
        if not getattr(config, "load_curve", False):
            return None
        curve = asyncio.run(measure_load_curve(engine))
        self.state.load_curve = curve
        return curve

    @staticmethod
    def _lora_config(spec: dict, args: dict):
        slots = int(spec["max_adapters"])
        return LoRAConfig(max_loras=min(int(args.get("max_loras", 4)), slots), max_cpu_loras=slots,
                          max_lora_rank=int(args.get("max_lora_rank", 16)))

    # --- adapters ---------------------------------------------------------------------------------
    def add_adapter(self, name: str, source: str, tenant: str | None = None) -> str:
        """Load `tenant`'s adapter from its folder of this worker's adapter root (or the model cache)."""
        with self.lock:
            engine = self.state.engine
            if engine is None:
                raise LoadError("no model is loaded on this worker", permanent=False)
            if name in self.adapters():
                return "already-loaded"
            add = getattr(engine, "add_adapter", None)
            if add is None:
                raise LoadError("this worker's engine has no adapter API yet (AsyncLLM.add_adapter)", permanent=True)
            path = self.resolve_adapter_source(source, tenant)
            try:
                self._maybe_await(add(name, path))
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise LoadError(f"adapter {name!r} from {source!r}: {exc}", permanent=True, kind="not_found") from exc
            except PERMANENT_ERRORS as exc:
                kind = "too_large" if "max_lora_rank" in str(exc) else "invalid"  # the directory exists (checked)
                raise LoadError(f"adapter {name!r} from {source!r}: {exc}", permanent=True, kind=kind) from exc
            except Exception as exc:  # noqa: BLE001
                raise LoadError(f"adapter {name!r} from {source!r} failed: {exc!r}", permanent=False) from exc
            self._adapters.add(name)
            self.counters["adapter_loads"] += 1
            return "loaded"

    def remove_adapter(self, name: str) -> bool:
        with self.lock:
            engine = self.state.engine
            if engine is None or name not in self.adapters():
                self._adapters.discard(name)
                return False
            self._maybe_await(engine.remove_adapter(name))
            self._adapters.discard(name)
            self.counters["adapter_unloads"] += 1
            return True

    def resolve_adapter_source(self, source: str, tenant: str | None = None) -> str:
        """A local path inside `<adapter root>/<tenant>/`, or an object in the model cache; else LoadError.

        Defence in depth: the control plane already refused sources outside the tenant's store;
        this worker refuses them again against its own --adapter-root (after `..` and symlinks).
        """
        parsed = urlparse(source)
        if parsed.scheme and len(parsed.scheme) > 1 and parsed.scheme != "file":
            base = (self.model_cache / parsed.scheme / parsed.netloc).resolve()
            cached = (base / parsed.path.lstrip("/")).resolve()
            if not cached.is_relative_to(base) or cached == base:
                raise LoadError(f"adapter source {source!r} resolves outside this worker's model cache ({base})",
                                permanent=True, kind="not_found")
            if not cached.exists():
                raise LoadError(f"adapter source {source!r}: not in this worker's model cache ({cached})",
                                permanent=True, kind="not_found")
            return str(cached)
        path = parsed.path if parsed.scheme == "file" else source
        try:
            resolved = resolve_in_root(path, self.adapter_root, tenant)
        except OutsideAdapterRoot as exc:
            log.warning("adapter source refused", extra={"source": source, "tenant": tenant, "reason": str(exc)})
            raise LoadError(f"adapter source {source!r} refused: {exc}", permanent=True, kind="not_found") from None
        if not resolved.exists():
            raise LoadError(f"adapter source {source!r} does not exist on this worker ({resolved})", permanent=True,
                            kind="not_found")
        return str(resolved)

    # --- the event loop's side --------------------------------------------------------------------
    def _call_on_loop(self, fn, *args):
        if self.loop is None or not self.loop.is_running():
            return fn(*args)
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed back to the calling thread
                box["error"] = exc
            finally:
                done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _maybe_await(self, result):
        if not inspect.isawaitable(result):
            return result
        if self.loop is not None and self.loop.is_running():
            return asyncio.run_coroutine_threadsafe(result, self.loop).result()
        return asyncio.run(result)

    def _attach(self, engine, source: str, served_name: str, tool_call_parser: str | None = None) -> None:
        state = self.state
        state.config.model, state.config.served_model_name = source, served_name
        state.config.tool_call_parser = tool_call_parser or self.default_tool_call_parser
        state.metrics = WorkerMetrics(served_name, lambda: state.engine.latest_stats if state.engine else None)
        state.load_error = None
        state.attach(engine)

    def _detach(self):
        engine, self.state.engine, self.state.serving = self.state.engine, None, None
        return engine
