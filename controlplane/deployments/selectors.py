"""Reads: the registry for operators, a tenant's own adapters, specs for workers, routes for the gateway."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import QuerySet
from django.utils import timezone

from common.errors import NotFound

from . import conf
from .models import (
    Adapter,
    AdapterPlacement,
    Deployment,
    Model,
    PlacementStatus,
    Replica,
    ReplicaRole,
    ReplicaStatus,
    Worker,
    WorkerStatus,
)


def model_list() -> QuerySet[Model]:
    return Model.objects.all()


def model_get(*, name: str) -> Model:
    model = Model.objects.filter(name=name).first()
    if model is None:
        raise NotFound(f"No model {name!r}.")
    return model


def worker_list() -> QuerySet[Worker]:
    return Worker.objects.all()


def worker_get(*, name: str) -> Worker:
    worker = Worker.objects.filter(name=name).first()
    if worker is None:
        raise NotFound(f"No worker {name!r}.")
    return worker


def deployment_list() -> QuerySet[Deployment]:
    return Deployment.objects.select_related("model", "autoscaler").prefetch_related("replicas__worker")


def deployment_get(*, name: str) -> Deployment:
    deployment = deployment_list().filter(name=name).first()
    if deployment is None:
        raise NotFound(f"No deployment {name!r}.")
    return deployment


def deployment_summary(deployment: Deployment) -> dict[str, int]:
    counts = {status: 0 for status in ReplicaStatus.values}
    for replica in deployment.replicas.all():
        counts[replica.status] += 1
    return counts


def adapter_list(*, tenant) -> QuerySet[Adapter]:
    """A tenant's own adapters (operators pass the tenant they look at)."""
    return Adapter.objects.filter(tenant=tenant).select_related("base_model", "tenant")


def adapter_get(*, tenant, adapter_id: int) -> Adapter:
    adapter = adapter_list(tenant=tenant).filter(pk=adapter_id).first()
    if adapter is None:  # another tenant's adapter is as absent as a missing one
        raise NotFound(f"No adapter {adapter_id}.")
    return adapter


# --- for workers (internal API) -------------------------------------------------------------------

def replica_spec(*, worker: Worker, replica_id: int) -> dict:
    """What a worker needs to act on a replica; 404 unless the replica is assigned to it."""
    replica = (Replica.objects.select_related("deployment__model", "worker")
               .filter(pk=replica_id, worker=worker).first())
    if replica is None:
        raise NotFound(f"Replica {replica_id} is not assigned to worker {worker.name}.")
    deployment, model = replica.deployment, replica.deployment.model
    engine_args = dict(deployment.engine_args or {})
    if model.context_length and "max_model_len" not in engine_args:
        engine_args["max_model_len"] = model.context_length
    return {
        "id": replica.pk, "uid": str(replica.uid), "attempt": replica.attempt, "status": replica.status,
        "deployment": deployment.name, "served_name": deployment.served_name,
        "model": {"name": model.name, "source": model.source_for(deployment.quantization),
                  "base_source": model.source, "architecture": model.architecture},
        "quantization": deployment.quantization, "engine_quantization": deployment.engine_quantization,
        "engine_args": engine_args, "max_adapters": deployment.max_adapters,
    }


def placement_spec(*, worker: Worker, placement_id: int) -> dict:
    placement = (AdapterPlacement.objects.select_related("adapter__tenant", "replica")
                 .filter(pk=placement_id, replica__worker=worker).first())
    if placement is None:
        raise NotFound(f"Adapter placement {placement_id} is not on worker {worker.name}.")
    adapter = placement.adapter
    return {"id": placement.pk, "attempt": placement.attempt, "status": placement.status,
            "adapter": adapter.served_name, "source": adapter.source, "rank": adapter.rank,
            "tenant": adapter.tenant.slug,  # the worker loads it only from <its adapter root>/<tenant>/
            "replica_uid": str(placement.replica.uid)}


# --- for the gateway ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Route:
    url: str  # the worker's base URL
    name: str  # what clients send as `model`
    base: str  # the base model's served name
    adapter: str | None  # the adapter's served name, None for the base model
    owner_tenant_id: int | None  # adapters: only this tenant may see or use it
    waiting: int = 0  # the worker's engine waiting queue at its last heartbeat
    seats: int = 0  # the engine's max_num_seqs (0: unknown)
    # disaggregated serving: a ready prefill replica of the same deployment, named to the worker with each
    # request (X-Tessera-Prefill-Url); None: the worker computes its prompts itself
    prefill_url: str | None = None


def routing_table(*, now: dt.datetime | None = None) -> list[Route]:
    """Ready replicas (and their ready adapters) on live, ready workers."""
    now = now or timezone.now()
    fresh_after = now - dt.timedelta(seconds=conf.get("TESSERA_WORKER_DEAD_SECONDS"))
    replicas = (Replica.objects.filter(status=ReplicaStatus.READY, worker__status=WorkerStatus.READY,
                                       worker__last_heartbeat_at__gte=fresh_after,
                                       drain_started_at__isnull=True)  # a draining replica gets no new requests
                .select_related("deployment", "worker"))
    routes: list[Route] = []
    by_id = {}
    load = {}
    replicas = list(replicas)
    prefill: dict[int, list[str]] = {}  # deployment -> its ready prefill replicas' workers, never routed to
    for replica in replicas:
        if replica.role == ReplicaRole.PREFILL:
            prefill.setdefault(replica.deployment_id, []).append(replica.worker.url.rstrip("/"))
    turn: dict[int, int] = {}
    for replica in replicas:
        if replica.role == ReplicaRole.PREFILL:
            continue
        worker, name = replica.worker, replica.deployment.served_name
        load[replica.pk] = (worker.num_waiting, int((worker.stats or {}).get("max_num_seqs") or 0))
        urls = prefill.get(replica.deployment_id)
        prefill_url = None
        if urls:  # the serving replicas share the prefill ones out in turn
            i = turn.get(replica.deployment_id, 0)
            prefill_url, turn[replica.deployment_id] = urls[i % len(urls)], i + 1
        routes.append(Route(worker.url.rstrip("/"), name, name, None, None, *load[replica.pk], prefill_url))
        by_id[replica.pk] = replica
    placements = (AdapterPlacement.objects.filter(status=PlacementStatus.READY, replica_id__in=list(by_id))
                  .select_related("adapter"))
    for placement in placements:
        replica = by_id[placement.replica_id]
        adapter = placement.adapter
        routes.append(Route(replica.worker.url.rstrip("/"), adapter.served_name, replica.deployment.served_name,
                            adapter.served_name, adapter.tenant_id, *load[replica.pk]))
    return routes


@dataclass(frozen=True, slots=True)
class Dormant:
    """A name a deployment scaled to zero serves: the gateway answers it with a cold start, not a 404."""

    name: str  # what clients send as `model`
    base: str  # the base model's served name
    adapter: str | None  # the adapter's served name, None for the base model
    owner_tenant_id: int | None  # adapters: only this tenant may see or use it (others get the 404)
    deployment_id: int


def dormant_table() -> list[Dormant]:
    """Autoscaled deployments allowed to sit at zero (min_replicas 0) with no ready replica that is not
    draining, and their tenants' adapters: the names a request may wake (autoscale/cold_start.py)."""
    deployments = (Deployment.objects.filter(max_replicas__isnull=False, min_replicas=0, deleting=False)
                   .exclude(pk__in=Replica.objects.filter(status=ReplicaStatus.READY, drain_started_at__isnull=True)
                            .values("deployment_id")))
    out: list[Dormant] = []
    for deployment in deployments:
        name = deployment.served_name
        out.append(Dormant(name, name, None, None, deployment.pk))
        for adapter in Adapter.objects.filter(base_model_id=deployment.model_id).exclude(status="deleting"):
            out.append(Dormant(adapter.served_name, name, adapter.served_name, adapter.tenant_id, deployment.pk))
    return out
