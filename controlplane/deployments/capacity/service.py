"""Capacity planning against the database: a deployment's measured curves, a tier's targets, a class's rate."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from billing.services.worker_rates import worker_rate_at
from common.errors import ApplicationError
from tenants.models import Tier

from ..models import Deployment, LoadCurve
from .curve import LoadCurve as Curve
from .plan import Plan, Targets, plan_replicas


@dataclass(frozen=True, slots=True)
class ClassPlan:
    worker_class: str
    measured_by: str  # the worker that measured the curve ("file" when given one)
    measured_at: str
    plan: Plan
    rated: bool  # False: the class has no hourly rate, so the plan has no cost


def targets_for(*, tier: str | None, ttft_ms: float | None, itl_ms: float | None) -> tuple[Targets, str]:
    """(targets, where they came from): explicit ms, else the tier's, else the strictest of all tiers'."""
    if tier:
        row = Tier.objects.filter(name=tier).first() if _storable(tier) else None
        if row is None:
            raise ApplicationError(f"tier {tier!r} does not exist", code="not_found", param="tier")
        tiers, source = [row], f"tier {tier}"
    else:
        tiers, source = list(Tier.objects.all()), "the strictest tier"
    ttfts = [t.slo_ttft_p95_ms for t in tiers if t.slo_ttft_p95_ms]
    itls = [t.slo_itl_p95_ms for t in tiers if t.slo_itl_p95_ms]
    ttft = ttft_ms if ttft_ms is not None else (min(ttfts) if ttfts else None)
    itl = itl_ms if itl_ms is not None else (min(itls) if itls else None)
    if ttft is None or itl is None:
        raise ApplicationError(f"no TTFT and ITL p95 targets in {source}: set the tier's SLO or pass "
                               "--ttft-ms and --itl-ms", code="invalid_value", param="tier")
    if ttft_ms is not None or itl_ms is not None:
        source = "the command line" if ttft_ms is not None and itl_ms is not None else f"{source} and the command line"
    return Targets(ttft / 1000, itl / 1000), source


def capacity_plan(*, deployment: str | None, rps: float, prompt_tokens: int, output_tokens: int, targets: Targets,
                  worker_class: str | None = None, curve: dict | None = None,
                  overhead_ms: float = 0.0) -> list[ClassPlan]:
    """One plan per worker class with a measured curve for the deployment (or for the curve given)."""
    if curve is not None:
        sources = [(worker_class or "file", "file", "", curve)]
    else:
        dep = Deployment.objects.filter(name=deployment).first() if _storable(deployment) else None
        if dep is None:
            raise ApplicationError(f"deployment {deployment!r} does not exist", code="not_found", param="deployment")
        rows = LoadCurve.objects.filter(deployment=dep).order_by("worker_class")
        if worker_class:
            rows = rows.filter(worker_class=worker_class) if _storable(worker_class) else rows.none()
        sources = [(r.worker_class, r.worker, r.measured_at.isoformat(), r.curve) for r in rows]
        if not sources:
            raise ApplicationError(
                f"no load curve for {deployment!r}{f' on {worker_class!r}' if worker_class else ''}: a replica reports "
                "one when it is ready (workers measure it after their warm-up), or pass a curve file",
                code="not_found", param="deployment")
    plans = []
    now = timezone.now()
    for cls, by, at, data in sources:
        try:
            parsed = Curve.from_dict(data)
            rate = worker_rate_at(worker_class=cls, at=now)
            plan = plan_replicas(parsed, rps=rps, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                 targets=targets, hourly_rate=rate.hourly_cost if rate else None,
                                 currency=rate.currency if rate else "", overhead_seconds=overhead_ms / 1000)
        except ValueError as exc:  # a malformed curve file, or a PlanError
            raise ApplicationError(f"{cls}: {exc}", code="invalid_value") from None
        plans.append(ClassPlan(cls, by, at, plan, rate is not None))
    return plans


def _storable(name: str | None) -> bool:
    """A name no row can have (PostgreSQL refuses a NUL in a query's text, with a 500 otherwise)."""
    return name is not None and "\x00" not in name
