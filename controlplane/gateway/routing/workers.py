"""Which workers exist, which are ready, what they serve, and which one gets the next request.

Workers come from the registry the deployments app installs (`install_registry`;
controlplane/deployments/routing.py: ready replicas on ready workers, read from the database), or, when TESSERA_WORKERS is set, from that static list
of base URLs: then each gateway process polls every worker's /ready and /v1/models in the
background; a model card with a `parent` is a LoRA adapter of that parent (vLLM's convention).

Routing (TESSERA_ROUTING_POLICY), among ready workers serving the model:
- cache_aware (default): where this gateway (or, through Redis, any gateway: shared_prefixes.py)
  sent the longest matching prefix of the request (tenant-salted chunk hashes), penalized by load,
  least loaded when imbalanced (prefix_routing.py);
- affinity: within AFFINITY_SLACK outstanding requests of the least loaded, rendezvous hashing on
  the prefix key (the tenant's cache salt + system prompt / first message);
- least_loaded, round_robin: the baselines benchmarks/routing.py compares against.
"Outstanding" is this process's own count.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from common.errors import ApplicationError
from controlplane.gateway import upstream
from controlplane.gateway.routing import prefix_routing, shared_prefixes

log = logging.getLogger("tessera.gateway")

AFFINITY_SLACK = 2  # how many more outstanding requests than the least-loaded worker affinity may cost
POLICIES = ("cache_aware", "affinity", "least_loaded", "round_robin")


@dataclass(frozen=True, slots=True)
class ModelTarget:
    name: str  # the id the client asked for (and the worker serves)
    base: str  # base model name
    adapter: str | None  # adapter name, None for the base model


@dataclass(slots=True)
class Worker:
    url: str
    ready: bool = False
    models: dict[str, ModelTarget] = field(default_factory=dict)
    outstanding: int = 0
    polled_at: float = 0.0  # monotonic; 0 = never
    failures: int = 0
    cards: list[dict] = field(default_factory=list)  # the worker's model cards as it returned them
    waiting: int = 0  # the engine's waiting queue at the last poll (/ready's body)
    seats: int = 0  # the engine's max_num_seqs (0 = unknown); in-flight beyond it are queued
    running: int = 0  # the engine's running requests at the last poll (the batch runner's admission)
    # disaggregated serving: model -> the prefill worker this worker fetches long prompts' KV blocks from,
    # sent with each request (X-Tessera-Prefill-Url); the routing table sets it (deployments/selectors.py)
    prefill: dict[str, str] = field(default_factory=dict)

    def mark_failed(self) -> None:
        self.ready = False
        self.failures += 1


class Registry:
    def __init__(self, urls: list[str]) -> None:
        self.workers = [Worker(url.rstrip("/")) for url in urls]
        self._poller: asyncio.Task | None = None
        self._poller_loop: asyncio.AbstractEventLoop | None = None
        self._refresh_lock: asyncio.Lock | None = None
        self.policy = getattr(settings, "TESSERA_ROUTING_POLICY", "cache_aware")
        if self.policy not in POLICIES:
            raise ImproperlyConfigured(f"TESSERA_ROUTING_POLICY={self.policy!r}: expected one of {', '.join(POLICIES)}")
        capacity = getattr(settings, "TESSERA_ROUTING_CACHE_CHUNKS", prefix_routing.DEFAULT_CAPACITY_CHUNKS)
        self.prefixes = prefix_routing.PrefixTable(capacity)
        self.shared = shared_prefixes.from_settings(settings, capacity)  # None: this process's table alone
        self._turn = itertools.count()

    # --- polling ----------------------------------------------------------------------------------

    async def poll_worker(self, worker: Worker) -> None:
        client = upstream.client()
        headers = upstream.worker_auth_headers()
        try:
            ready = await client.get(f"{worker.url}/ready", headers=headers, timeout=2.0)
            models = await client.get(f"{worker.url}/v1/models", headers=headers, timeout=2.0)
            models.raise_for_status()
            cards = models.json().get("data", [])
        except (httpx.HTTPError, ValueError) as exc:
            if worker.ready or worker.polled_at == 0:
                log.warning("worker unreachable", extra={"worker": worker.url, "error": repr(exc)})
            worker.mark_failed()
            worker.polled_at = time.monotonic()
            if self.shared is not None and self.prefixes.size(worker.url):  # once per failure, not per poll
                self.shared.forget(worker.url)
            self.prefixes.forget(worker.url)  # back after a restart with an empty cache
            return
        targets: dict[str, ModelTarget] = {}
        for card in cards:
            name = card.get("id")
            if not name:
                continue
            parent = card.get("parent")
            targets[name] = ModelTarget(name, parent or name, name if parent else None)
        worker.models, worker.cards = targets, cards
        try:  # load figures (admission.py); an older worker's /ready has none
            load = ready.json()
            worker.waiting = int(load.get("waiting") or 0)
            worker.seats = int(load.get("max_num_seqs") or 0)
            worker.running = int(load.get("running") or 0)
        except (ValueError, TypeError, AttributeError):
            worker.waiting = 0
        worker.ready = ready.status_code == 200
        worker.failures = 0 if worker.ready else worker.failures + 1
        worker.polled_at = time.monotonic()

    async def refresh(self) -> None:
        await asyncio.gather(*(self.poll_worker(w) for w in self.workers))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(settings.TESSERA_WORKER_POLL_SECONDS)
            try:
                await self.refresh()
            except Exception:  # never let the poller die
                log.exception("worker poll failed")

    async def ensure_polling(self) -> None:
        """First use in an event loop: poll once now, then keep polling in the background."""
        loop = asyncio.get_running_loop()
        if self._poller_loop is loop and self._poller is not None and not self._poller.done():
            return
        if self._refresh_lock is None or self._poller_loop is not loop:
            self._refresh_lock = asyncio.Lock()
            self._poller_loop = loop
            self._poller = None
        async with self._refresh_lock:
            if self._poller is None or self._poller.done():
                await self.refresh()
                self._poller = loop.create_task(self._poll_forever())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    # --- lookup and routing -----------------------------------------------------------------------

    def known_models(self) -> dict[str, ModelTarget]:
        seen: dict[str, ModelTarget] = {}
        for worker in self.workers:
            seen.update(worker.models)
        return seen

    def resolve(self, name: str) -> ModelTarget:
        target = self.known_models().get(name)
        if target is None:
            raise ApplicationError(
                f"The model `{name}` does not exist or you do not have access to it.",
                code="model_not_found", status=404, param="model",
            )
        return target

    async def cold_start(self, target: ModelTarget) -> None:
        """After authorization: a registry that scales to zero raises its cold-start 503 here (and
        wakes the deployment); the static list never does."""
        return None

    def candidates(self, name: str, exclude: set[str] = frozenset()) -> list[Worker]:
        return [w for w in self.workers if w.ready and name in w.models and w.url not in exclude]

    async def shared_matches(self, name: str, prefix: prefix_routing.PrefixKey) -> dict[str, int] | None:
        """Once per request, before `pick`: what every gateway routed to the model's ready workers (one
        Redis round trip, bounded by TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS); None: the local table alone."""
        if self.shared is None or self.policy != "cache_aware":
            return None
        return await self.shared.matched_chunks([w.url for w in self.candidates(name)], prefix)

    def pick(self, name: str, affinity_key: bytes, exclude: set[str] = frozenset(),
             prefix: prefix_routing.PrefixKey | None = None, shared: dict[str, int] | None = None) -> Worker | None:
        """`prefix`: the request's salted prefix chunks (prefix_routing.prefix_key), for cache_aware;
        `shared`: `shared_matches`' answer for it."""
        ready = self.candidates(name, exclude)
        if not ready:
            return None
        if self.policy == "round_robin":
            return ready[next(self._turn) % len(ready)]
        if self.policy == "least_loaded":
            start = next(self._turn) % len(ready)  # ties rotate, or idle workers would all go to the first
            return min(ready[start:] + ready[:start], key=prefix_routing.load_of)
        if self.policy == "cache_aware" and prefix is not None:
            worker, _ = prefix_routing.choose(ready, prefix, self.prefixes, shared=shared)
            self.prefixes.record(worker.url, prefix)
            if self.shared is not None:
                self.shared.record(worker.url, prefix)
            return worker  # type: ignore[return-value]
        least = min(w.outstanding for w in ready)
        balanced = [w for w in ready if w.outstanding <= least + AFFINITY_SLACK]
        return max(balanced, key=lambda w: hashlib.blake2b(affinity_key + w.url.encode(), digest_size=8).digest())


_registry: tuple[str, Registry] | None = None
_dynamic_registry: Callable[[], Registry] | None = None


def get_registry() -> Registry:
    """The process's registry: the static TESSERA_WORKERS list when set, else the deployments
    registry (ready workers and replicas from the database; rebuilt if the setting changes)."""
    global _registry
    configured = settings.TESSERA_WORKERS
    if _registry is None or _registry[0] != configured:
        urls = [u.strip() for u in configured.split(",") if u.strip()]
        if urls:
            _registry = (configured, Registry(urls))
        elif _dynamic_registry is None:
            raise ImproperlyConfigured("TESSERA_WORKERS is empty and no registry is installed "
                                       "(controlplane.deployments installs one when its app is ready)")
        else:
            _registry = (configured, _dynamic_registry())
    return _registry[1]


def install_registry(factory: Callable[[], Registry]) -> None:
    """The registry get_registry() builds when TESSERA_WORKERS is empty. The deployments app installs
    its database-backed one at start-up, so this module (the interface) never imports its implementer."""
    global _dynamic_registry, _registry
    _dynamic_registry = factory
    _registry = None


def visible_to(target: ModelTarget, tenant_id: int) -> bool:
    """Adapters from the deployments registry carry their owner: no other tenant sees or uses them."""
    owner = getattr(target, "owner_tenant_id", None)
    return owner is None or owner == tenant_id
