"""The gateway's worker registry from the control plane's database (replaces the static list).

Implements the gateway's `Registry` interface; DeploymentsConfig.ready installs it, and
`controlplane.gateway.routing.workers.get_registry()` builds it when TESSERA_WORKERS is empty (the default). Every TESSERA_WORKER_POLL_SECONDS each gateway process reads the routing table
(`selectors.routing_table`: ready replicas and ready adapter placements on ready, heartbeating
workers) instead of polling workers itself; `outstanding` counts survive refreshes because the
same `Worker` objects are kept per URL. A worker the gateway failed to reach stays out of its
rotation for DOWN_SECONDS even if the table still lists it (the heartbeat has not lapsed yet).
Adapters carry their owner tenant; the gateway hides them from every other tenant. Names that only
an autoscaled deployment at zero serves (selectors.dormant_table) resolve to a DormantTarget, and
`cold_start` answers them 503 + Retry-After while waking the deployment (autoscale/cold_start.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from common.asyncdb import db_call
from controlplane.gateway.routing.workers import ModelTarget, Registry, Worker

from . import selectors
from .autoscale.cold_start import Waker

log = logging.getLogger("tessera.gateway")

DOWN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class OwnedModelTarget(ModelTarget):
    owner_tenant_id: int | None = None  # set for adapters: the only tenant that may see or use it


@dataclass(frozen=True, slots=True)
class DormantTarget(OwnedModelTarget):
    deployment_id: int = 0  # a deployment scaled to zero that a request for this name wakes


@dataclass(slots=True)
class RoutedWorker(Worker):
    down_until: float = 0.0  # monotonic; set when a request could not reach it

    def mark_failed(self) -> None:
        Worker.mark_failed(self)
        self.down_until = time.monotonic() + DOWN_SECONDS


class DeploymentRegistry(Registry):
    def __init__(self) -> None:
        super().__init__([])
        self.dormant: dict[str, DormantTarget] = {}
        self.waker = Waker()

    async def refresh(self) -> None:
        try:
            routes, dormant = await db_call(_tables)
        except Exception as exc:  # noqa: BLE001 - keep routing on the last table rather than fail requests
            log.warning("routing table unavailable; keeping the last one", extra={"error": repr(exc)})
            return
        self.apply(routes, dormant)

    def resolve(self, name: str) -> ModelTarget:
        """A name only a deployment at zero serves resolves to its DormantTarget (cold_start answers it)."""
        if name not in self.known_models() and name in self.dormant:
            return self.dormant[name]
        return super().resolve(name)

    async def cold_start(self, target: ModelTarget) -> None:
        if isinstance(target, DormantTarget):
            await self.waker.refuse(name=target.name, deployment_id=target.deployment_id)

    def apply(self, routes: list[selectors.Route], dormant: list[selectors.Dormant] = ()) -> None:
        self.dormant = {d.name: DormantTarget(d.name, d.base, d.adapter, d.owner_tenant_id, d.deployment_id)
                        for d in dormant}
        now = time.monotonic()
        current = {w.url: w for w in self.workers}
        grouped: dict[str, dict[str, ModelTarget]] = {}
        load: dict[str, tuple[int, int]] = {}
        prefill: dict[str, dict[str, str]] = {}
        for route in routes:
            grouped.setdefault(route.url, {})[route.name] = OwnedModelTarget(
                route.name, route.base, route.adapter, route.owner_tenant_id)
            load[route.url] = (route.waiting, route.seats)
            if route.prefill_url:
                prefill.setdefault(route.url, {})[route.name] = route.prefill_url
        workers: list[Worker] = []
        for url, models in grouped.items():
            worker = current.get(url) or RoutedWorker(url)
            worker.models = models
            worker.prefill = prefill.get(url, {})  # model -> the prefill worker named with its requests
            if hasattr(worker, "waiting"):  # load figures for admission.py's shedding
                worker.waiting, worker.seats = load[url]
            worker.ready = now >= getattr(worker, "down_until", 0.0)
            worker.polled_at = now
            workers.append(worker)
        self.workers = workers
        self.prefixes.retain(set(grouped))


def _tables() -> tuple[list[selectors.Route], list[selectors.Dormant]]:
    return selectors.routing_table(), selectors.dormant_table()
