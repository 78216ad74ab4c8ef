"""Read one deployment's autoscaling signals from the database into a plain `policy.Signals`.

- queue, running, KV cache: what each ready replica's worker said in its last heartbeat (the agent
  sends num_running / num_waiting / kv_cache_usage every TESSERA_WORKER_HEARTBEAT_SECONDS; the
  gateway's shedding reads the same figures through the routing table). A worker whose last
  heartbeat is older than three intervals is "not reporting": its replica counts as ready, its load
  as unknown, and the policy then removes nothing.
- burn: the deployment's requests (billing's UsageRecord, `model` = the base model's served name,
  so a tenant's adapters count too; batch lines excluded, as in the SLO selectors) over the last
  5 minutes, per tier: the share that missed the tier's TTFT or ITL target over the 5 % budget of a
  p95 promise. The highest among the tiers and the two latency SLIs is the signal. Availability is
  left out on purpose: 5xx from a broken model or source do not get better with more replicas.
  Tiers with fewer than TESSERA_AUTOSCALE_BURN_MIN_EVENTS requests in the window give no reading
  (2 slow requests out of 3 is a burn rate of 13, and noise).
- recent requests: whether any request used the deployment in TESSERA_AUTOSCALE_IDLE_SECONDS (at
  most 100 counted: only zero matters), which alone may take the last replica away.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Case, Count, IntegerField, Q, Sum, When

from billing.models import UsageRecord
from tenants.models import Tier

from .. import conf
from ..models import Deployment, Replica, ReplicaStatus, WorkerStatus
from .policy import Signals

BURN_WINDOW_SECONDS = 300  # the fast-burn alert's short window (controlplane/slo/sli.py BURN_ALERTS)
LATENCY_BUDGET = 0.05  # a p95 target's error budget (controlplane/slo/sli.py LATENCY_OBJECTIVE)
RECENT_CAP = 100


def read_signals(*, deployment: Deployment, now: dt.datetime, replicas: list[Replica] | None = None) -> Signals:
    if replicas is None:
        replicas = list(deployment.replicas.select_related("worker"))
    fresh_after = now - dt.timedelta(seconds=3 * conf.get("TESSERA_WORKER_HEARTBEAT_SECONDS"))
    ready = [r for r in replicas if r.status == ReplicaStatus.READY and r.drain_started_at is None]
    reporting = [r.worker for r in ready if r.worker is not None and r.worker.status == WorkerStatus.READY
                 and r.worker.last_heartbeat_at is not None and r.worker.last_heartbeat_at >= fresh_after]
    kv = [float(w.kv_cache_usage or 0.0) for w in reporting]
    return Signals(
        now=now.timestamp(), current=deployment.desired_replicas, ready=len(ready), reporting=len(reporting),
        running=sum(w.num_running for w in reporting), waiting=sum(w.num_waiting for w in reporting),
        seats=sum(int((w.stats or {}).get("max_num_seqs") or 0) for w in reporting),
        kv_usage_max=max(kv) if kv else None, kv_usage_mean=sum(kv) / len(kv) if kv else None,
        fast_burn=fast_burn(model=deployment.served_name, now=now),
        recent_requests=recent_requests(model=deployment.served_name, now=now),
    )


def _bad(column: str, targets: dict[str, int]) -> Case:
    whens = [When(**{"tier": tier, f"{column}__gt": ms}, then=1) for tier, ms in targets.items()]
    return Case(*whens, default=0, output_field=IntegerField())


def fast_burn(*, model: str, now: dt.datetime) -> float | None:
    """Highest 5-minute TTFT / ITL burn rate among the tiers with traffic on `model`; None: too few requests."""
    tiers = list(Tier.objects.values_list("name", "slo_ttft_p95_ms", "slo_itl_p95_ms"))
    ttft = {name: ms for name, ms, _ in tiers if ms is not None}
    itl = {name: ms for name, _, ms in tiers if ms is not None}
    if not ttft and not itl:
        return None
    window = Q(created_at__gte=now - dt.timedelta(seconds=BURN_WINDOW_SECONDS), created_at__lte=now)
    rows = (UsageRecord.objects.filter(window, model=model, batch_id="").values("tier")
            .annotate(ttft_total=Count("id", filter=Q(ttft_ms__isnull=False, tier__in=list(ttft))),
                      ttft_bad=Sum(_bad("ttft_ms", ttft), filter=Q(ttft_ms__isnull=False)),
                      itl_total=Count("id", filter=Q(itl_ms__isnull=False, tier__in=list(itl))),
                      itl_bad=Sum(_bad("itl_ms", itl), filter=Q(itl_ms__isnull=False)))
            .order_by("tier"))
    least = conf.get("TESSERA_AUTOSCALE_BURN_MIN_EVENTS")
    rates = [(row[f"{sli}_bad"] or 0) / row[f"{sli}_total"] / LATENCY_BUDGET
             for row in rows for sli in ("ttft", "itl") if row[f"{sli}_total"] and row[f"{sli}_total"] >= least]
    return max(rates) if rates else None


def recent_requests(*, model: str, now: dt.datetime) -> int:
    since = now - dt.timedelta(seconds=conf.get("TESSERA_AUTOSCALE_IDLE_SECONDS"))
    return len(UsageRecord.objects.filter(model=model, created_at__gte=since).values_list("id", flat=True)[:RECENT_CAP])
