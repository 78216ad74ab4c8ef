"""LoRA adapters on the worker: load / unload / list routes, `model` naming an adapter, metrics.

    POST   /v1/adapters         {"name": ..., "path": ...}  load a PEFT adapter directory (idempotent)
    DELETE /v1/adapters/{name}                               unload (409 while requests use it)
    GET    /v1/adapters                                      what is loaded
    GET    /v1/models                                        the base model, then one card per adapter

A request selects an adapter by putting its registered name in OpenAI's `model` field; the
gateway decides which tenant may name which adapter. With `--adapter-root` set, a path that
resolves (after `..` and symlinks) outside that folder is refused (400 adapter_outside_root). Reading and checking an adapter runs on a
worker thread, so loading one never holds up the engine's decode steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, Protocol

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dataplane.engine.async_llm import AsyncLLM, EngineDeadError
from dataplane.lora.manager import LoRAStats
from dataplane.worker import errors
from dataplane.worker.adapter_root import OutsideAdapterRoot, resolve_in_root
from dataplane.worker.config import WorkerConfig
from dataplane.worker.metrics import P, WorkerMetrics


class WorkerState(Protocol):
    """What these routes read of dataplane.worker.state.WorkerState (which imports this module)."""

    config: WorkerConfig
    engine: AsyncLLM | None
    metrics: WorkerMetrics
    created: int

    def status(self) -> str: ...


def resolve_model(requested: str | None, served: str, engine: AsyncLLM | None) -> str | None:
    """The adapter a request's `model` names (None: the base model); 404 for anything else."""
    if requested is None or requested == served:
        return None
    stats = _lora_stats(engine)
    if stats is not None and requested in stats.loaded:
        return requested
    raise errors.WorkerError(f"The model `{requested}` does not exist (this worker serves `{served}` and its "
                             "loaded adapters).", status=404, code="model_not_found", param="model")


def model_cards(state: WorkerState) -> list[dict[str, Any]]:
    stats = _lora_stats(state.engine)
    if stats is None:
        return []
    return [{"id": name, "object": "model", "created": state.created, "owned_by": "tessera",
             "root": name, "parent": state.config.model_id} for name in stats.loaded]


def routes(state: WorkerState, authorize: Callable[[Request], None]) -> list[Route]:
    def engine() -> AsyncLLM:
        if state.engine is None or state.status() == "dead":
            raise errors.unavailable(f"The model is {state.status()}; retry shortly.", state.config.retry_after,
                                     "model_" + state.status())
        if _lora_stats(state.engine) is None:
            raise errors.WorkerError("This worker serves no LoRA adapters (start it with --enable-lora).",
                                     status=400, code="lora_disabled")
        return state.engine

    async def guarded(request: Request, action) -> Response:  # noqa: ANN001
        try:
            authorize(request)
            return await action(engine())
        except errors.WorkerError as exc:
            return exc.response()
        except EngineDeadError as exc:
            return errors.unavailable(str(exc), state.config.retry_after, "engine_dead").response()

    async def load(request: Request) -> Response:
        async def action(llm: AsyncLLM) -> Response:
            try:
                body = orjson.loads(await request.body())
            except orjson.JSONDecodeError:
                raise errors.invalid("The body must be JSON: {\"name\": ..., \"path\": ...}.") from None
            if not isinstance(body, dict) or not isinstance(body.get("name"), str) \
                    or not isinstance(body.get("path"), str):
                raise errors.invalid("name and path: both are required strings.", "name")
            path = body["path"]
            if state.config.adapter_root:  # --adapter-root: nothing outside it, whoever asks
                try:
                    path = str(resolve_in_root(path, state.config.adapter_root))
                except OutsideAdapterRoot:
                    raise errors.invalid("path: outside this worker's adapter root (--adapter-root).", "path",
                                         "adapter_outside_root") from None
            try:
                await llm.add_adapter(body["name"], path)
            except ValueError as exc:
                raise errors.invalid(_strip(str(exc)), "name" if "name" in str(exc) else "path",
                                     "invalid_adapter") from None
            info = next((a for a in await llm.list_adapters() if a.name == body["name"]), None)
            return _json(_card(info) if info else {"id": body["name"], "object": "adapter"})

        return await guarded(request, action)

    async def unload(request: Request) -> Response:
        name = request.path_params["name"]

        async def action(llm: AsyncLLM) -> Response:
            try:
                await llm.remove_adapter(name)
            except ValueError as exc:
                text = str(exc)
                if "unknown adapter" in text:
                    raise errors.WorkerError(_strip(text), status=404, code="adapter_not_found", param="name") from None
                raise errors.WorkerError(_strip(text), status=409, code="adapter_in_use", param="name") from None
            return _json({"id": name, "object": "adapter", "deleted": True})

        return await guarded(request, action)

    async def listing(request: Request) -> Response:
        async def action(llm: AsyncLLM) -> Response:
            return _json({"object": "list", "data": [_card(a) for a in await llm.list_adapters()]})

        return await guarded(request, action)

    return [Route("/v1/adapters", load, methods=["POST"]), Route("/v1/adapters", listing, methods=["GET"]),
            Route("/v1/adapters/{name:path}", unload, methods=["DELETE"])]


class LoRACollector(Collector):
    """Adapter gauges from the engine's latest LoRA snapshot, read at scrape time (vLLM: lora_requests_info)."""

    def __init__(self, model_name: str, stats: Callable[[], LoRAStats | None]) -> None:
        self.model_name = model_name
        self.stats = stats

    def _families(self, s: LoRAStats | None) -> Iterator[Metric]:
        m = self.model_name
        loaded = GaugeMetricFamily(P + "lora_adapters_loaded", "LoRA adapters registered on this worker",
                                   labels=["model_name"])
        running = GaugeMetricFamily(P + "lora_requests_running", "Running requests per LoRA adapter",
                                    labels=["model_name", "adapter"])
        waiting = GaugeMetricFamily(P + "lora_requests_waiting", "Waiting requests per LoRA adapter",
                                    labels=["model_name", "adapter"])
        info = GaugeMetricFamily(P + "lora_requests_info", "Adapters with running / waiting requests "
                                 "(labels, as vLLM's); the value is the scrape time",
                                 labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
        loads = CounterMetricFamily(P + "lora_slot_loads", "Adapters copied into a device slot", labels=["model_name"])
        evictions = CounterMetricFamily(P + "lora_slot_evictions", "Adapters evicted from a device slot",
                                        labels=["model_name"])
        if s is not None:
            loaded.add_metric([m], float(len(s.loaded)))
            for name in s.loaded:
                running.add_metric([m, name], float(s.running.get(name, 0)))
                waiting.add_metric([m, name], float(s.waiting.get(name, 0)))
            info.add_metric([",".join(sorted(s.running)), ",".join(sorted(s.waiting)), str(s.max_loras)], time.time())
            loads.add_metric([m], float(s.slot_loads))
            evictions.add_metric([m], float(s.slot_evictions))
        yield from (loaded, running, waiting, info, loads, evictions)

    def describe(self) -> Iterator[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        return self._families(self.stats())


def register_metrics(state: WorkerState) -> None:
    state.metrics.registry.register(LoRACollector(state.metrics.model_name, lambda: _lora_stats(state.engine)))


def _lora_stats(engine: AsyncLLM | None) -> LoRAStats | None:
    """The engine's latest adapter snapshot (refreshed by every add/remove); None when LoRA is off."""
    return getattr(engine, "latest_lora_stats", None)


def _card(info) -> dict[str, Any]:  # noqa: ANN001 - an AdapterInfo
    return {"id": info.name, "object": "adapter", **{k: v for k, v in asdict(info).items() if k != "name"}}


def _strip(text: str) -> str:
    return text.removeprefix("adapter: ")


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
