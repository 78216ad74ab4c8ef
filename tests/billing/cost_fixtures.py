"""Helpers for the cost tests: a ready replica on a worker of a class, its span, a rate."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal


def ready_replica(*, deployment: str = "llama", model: str = "llama-8b", worker: str | None = None,
                  accelerator: str = "H100", labels: dict | None = None, ready_at: datetime):
    from controlplane.deployments.models import Deployment, Model, Replica, ReplicaStatus, Worker

    base, _ = Model.objects.get_or_create(name=model, defaults={"source": "smollm2-135m-instruct"})
    dep, _ = Deployment.objects.get_or_create(name=deployment, defaults={"model": base})
    name = worker or f"w-{uuid.uuid4().hex[:8]}"
    w = Worker.objects.create(name=name, url=f"http://{name}:8000", accelerator=accelerator, labels=labels or {},
                              status="ready")
    return Replica.objects.create(deployment=dep, worker=w, status=ReplicaStatus.READY, ready_at=ready_at)


def span(*, started_at: datetime, last_seen_at: datetime, worker_url: str = "http://w1:8000",
         worker_class: str = "H100", deployment: str = "llama", model: str = "llama-8b"):
    from billing.models import ReplicaSpan

    return ReplicaSpan.objects.create(replica_uid=uuid.uuid4(), started_at=started_at, last_seen_at=last_seen_at,
                                      deployment=deployment, model=model, worker=worker_url, worker_url=worker_url,
                                      worker_class=worker_class)


def rate(*, worker_class: str = "H100", hourly: str = "3.60", prefill: str = "2000", decode: str = "50",
         start: datetime, end: datetime | None = None, currency: str = "usd"):
    from billing.services import worker_rate_create

    return worker_rate_create(worker_class=worker_class, hourly_cost=Decimal(hourly),
                              prefill_tokens_per_second=Decimal(prefill), decode_tokens_per_second=Decimal(decode),
                              effective_from=start, effective_to=end, currency=currency)
