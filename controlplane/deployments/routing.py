"""The gateway's worker registry from the control plane's database (replaces the static list).

Implements the gateway's `Registry` interface; DeploymentsConfig.ready installs it, and
`controlplane.gateway.workers.get_registry()` builds it when TESSERA_WORKERS is empty (the default). Every TESSERA_WORKER_POLL_SECONDS each gateway process reads the routing table
(`selectors.routing_table`: ready replicas and ready adapter placements on ready, heartbeating
workers) instead of polling workers itself; `outstanding` counts survive refreshes because the
same `Worker` objects are kept per URL. A worker the gateway failed to reach stays out of its
rotation for DOWN_SECONDS even if the table still lists it (the heartbeat has not lapsed yet).
Adapters carry their owner tenant; the gateway hides them from every other tenant.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from controlplane.asyncdb import db_call
from controlplane.gateway.workers import ModelTarget, Registry, Worker

from . import selectors

log = logging.getLogger("tessera.gateway")

DOWN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class OwnedModelTarget(ModelTarget):
    owner_tenant_id: int | None = None  # set for adapters: the only tenant that may see or use it


@dataclass(slots=True)
class RoutedWorker(Worker):
    down_until: float = 0.0  # monotonic; set when a request could not reach it

    def mark_failed(self) -> None:
        Worker.mark_failed(self)
        self.down_until = time.monotonic() + DOWN_SECONDS


class DeploymentRegistry(Registry):
    def __init__(self) -> None:
        super().__init__([])

    async def refresh(self) -> None:
        try:
            routes = await db_call(selectors.routing_table)
        except Exception as exc:  # noqa: BLE001 - keep routing on the last table rather than fail requests
            log.warning("routing table unavailable; keeping the last one", extra={"error": repr(exc)})
            return
        self.apply(routes)

    def apply(self, routes: list[selectors.Route]) -> None:
        now = time.monotonic()
        current = {w.url: w for w in self.workers}
        grouped: dict[str, dict[str, ModelTarget]] = {}
        load: dict[str, tuple[int, int]] = {}
        for route in routes:
            grouped.setdefault(route.url, {})[route.name] = OwnedModelTarget(
                route.name, route.base, route.adapter, route.owner_tenant_id)
            load[route.url] = (route.waiting, route.seats)
        workers: list[Worker] = []
        for url, models in grouped.items():
            worker = current.get(url) or RoutedWorker(url)
            worker.models = models
            if hasattr(worker, "waiting"):  # load figures for admission.py's shedding
                worker.waiting, worker.seats = load[url]
            worker.ready = now >= getattr(worker, "down_until", 0.0)
            worker.polled_at = now
            workers.append(worker)
        self.workers = workers
        self.prefixes.retain(set(grouped))
