"""SLIs from the request records (billing's `UsageRecord`: one row per admitted request).

Counts are one SQL aggregation over the longest window (30 days, on the `created_at` index) with a
conditional count per window and SLI, grouped by tenant / tier / model as asked. Latency targets
differ per tier, so "met the target" is a CASE over the tier names. Percentiles (shown next to
the attainment, never used for alerts) are nearest-rank `ORDER BY … OFFSET k LIMIT 1` queries per
group over the 1 h and 24 h windows only: the 30-day p95 would sort a month of rows per group.

Which rows count (docs/slo.md):
- availability: every record; bad = status "error" with an HTTP status ≥ 500 (or none recorded,
  i.e. older rows: counted against us, conservatively). 4xx and client disconnects (499) are good.
- ttft: records with a first token (`ttft_ms` not null); itl: streams with ≥ 2 tokens (`itl_ms`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import Case, Count, IntegerField, Q, Sum, When
from django.utils import timezone

from billing.models import UsageRecord
from tenants.models import Tenant, Tier

from . import sli

GROUP_FIELDS = {"tenant": "tenant__slug", "tier": "tier", "model": "model"}
PERCENTILE_WINDOWS = ("1h", "24h")
PLATFORM_BAD = Q(status=UsageRecord.Status.ERROR) & (Q(http_status__gte=500) | Q(http_status__isnull=True))


@dataclass(frozen=True, slots=True)
class Targets:
    ttft_ms: int | None
    itl_ms: int | None
    availability_pct: float | None

    def objective(self, name: str) -> float | None:
        target = self.ttft_ms if name == "ttft" else self.itl_ms
        return sli.objective_for(name, availability_pct=self.availability_pct, target_ms=target)


@dataclass(slots=True)
class SLOStatus:
    tenant: str | None
    tier: str | None
    model: str | None
    targets: Targets
    # window -> sli -> {"total", "bad", "attainment", "burn_rate"}
    windows: dict[str, dict[str, dict]] = field(default_factory=dict)
    p95_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)  # window -> {"ttft", "itl"}
    budget_remaining: dict[str, float | None] = field(default_factory=dict)  # sli -> share of 30-day budget
    alerts: dict[str, list[str]] = field(default_factory=dict)  # sli -> firing alert names

    def as_dict(self) -> dict:
        return {
            "tenant": self.tenant, "tier": self.tier, "model": self.model,
            "targets": {"ttft_p95_ms": self.targets.ttft_ms, "itl_p95_ms": self.targets.itl_ms,
                        "availability_pct": self.targets.availability_pct},
            "windows": {w: {**self.windows[w], "p95_ms": self.p95_ms.get(w)} for w in sli.REPORTED_WINDOWS},
            "burn_rates": {s: {w: self.windows[w][s]["burn_rate"] for w in sli.WINDOWS} for s in sli.SLIS},
            "error_budget_remaining": self.budget_remaining,
            "alerts": self.alerts,
        }


def tier_targets() -> dict[str, Targets]:
    return {
        t.name: Targets(t.slo_ttft_p95_ms, t.slo_itl_p95_ms,
                        None if t.slo_availability_pct is None else float(t.slo_availability_pct))
        for t in Tier.objects.all()
    }


def _met_case(column: str, targets: dict[str, int | None], *, bad: bool) -> Case:
    whens = [When(**{"tier": name, f"{column}__{'gt' if bad else 'lte'}": ms}, then=1)
             for name, ms in targets.items() if ms is not None]
    return Case(*whens, default=0, output_field=IntegerField())


def sli_counts(
    *, now: dt.datetime, group_by: tuple[str, ...], tenant: Tenant | None = None,
    targets: dict[str, Targets],
) -> dict[tuple, dict[str, dict[str, int]]]:
    """{group key: {window: {"total", "bad", "ttft_total", "ttft_bad", "itl_total", "itl_bad"}}}."""
    # Batch API lines (batch_id set) are not online traffic: a line queued behind the online tiers on
    # purpose is not a missed TTFT target.
    qs = UsageRecord.objects.filter(created_at__gte=now - dt.timedelta(seconds=max(sli.WINDOWS.values())),
                                    created_at__lte=now, batch_id="")
    if tenant is not None:
        qs = qs.filter(tenant=tenant)
    ttft_tiers = [n for n, t in targets.items() if t.ttft_ms is not None]
    itl_tiers = [n for n, t in targets.items() if t.itl_ms is not None]
    aggregates = {}
    for window, seconds in sli.WINDOWS.items():
        inside = Q(created_at__gte=now - dt.timedelta(seconds=seconds))
        ttft = inside & Q(ttft_ms__isnull=False, tier__in=ttft_tiers)
        itl = inside & Q(itl_ms__isnull=False, tier__in=itl_tiers)
        aggregates.update({
            f"total_{window}": Count("id", filter=inside),
            f"bad_{window}": Count("id", filter=inside & PLATFORM_BAD),
            f"ttft_total_{window}": Count("id", filter=ttft),
            f"ttft_bad_{window}": Sum(_met_case("ttft_ms", {n: t.ttft_ms for n, t in targets.items()}, bad=True),
                                      filter=ttft),
            f"itl_total_{window}": Count("id", filter=itl),
            f"itl_bad_{window}": Sum(_met_case("itl_ms", {n: t.itl_ms for n, t in targets.items()}, bad=True),
                                     filter=itl),
        })
    columns = [GROUP_FIELDS[g] for g in group_by]
    rows = qs.values(*columns).annotate(**aggregates).order_by(*columns)
    out: dict[tuple, dict[str, dict[str, int]]] = {}
    for row in rows:
        key = tuple(row[c] for c in columns)
        out[key] = {
            w: {k: row[f"{k}_{w}"] or 0 for k in ("total", "bad", "ttft_total", "ttft_bad", "itl_total", "itl_bad")}
            for w in sli.WINDOWS
        }
    return out


def p95_ms(*, now: dt.datetime, window: str, column: str, filters: dict) -> float | None:
    """Nearest-rank p95 of one column over one window, in the database."""
    qs = UsageRecord.objects.filter(
        created_at__gte=now - dt.timedelta(seconds=sli.WINDOWS[window]), created_at__lte=now, batch_id="",
        **{f"{column}__isnull": False}, **filters,
    )
    n = qs.count()
    if n == 0:
        return None
    return qs.order_by(column).values_list(column, flat=True)[sli.percentile_rank(n, 95)]


def slo_status(
    *, tenant: Tenant | None = None, group_by: tuple[str, ...] = ("tenant", "tier", "model"),
    now: dt.datetime | None = None, percentiles: bool = True,
) -> list[SLOStatus]:
    """SLO status per group (tenant, tier, model by default); `tenant` restricts to one tenant's rows.

    `group_by` must include "tier" (targets are per tier).
    """
    if "tier" not in group_by:
        raise ValueError(f"group_by: must include 'tier', got {group_by}")
    now = now or timezone.now()
    targets = tier_targets()
    counts = sli_counts(now=now, group_by=group_by, tenant=tenant, targets=targets)
    result = []
    for key, per_window in counts.items():
        labels = dict(zip(group_by, key, strict=True))
        tier_targets_ = targets.get(labels["tier"], Targets(None, None, None))
        status = SLOStatus(labels.get("tenant"), labels["tier"], labels.get("model"), tier_targets_)
        for window, c in per_window.items():
            status.windows[window] = {
                name: _sli_view(good_total=(c[tot] - c[bad], c[tot]), bad=c[bad],
                                objective=tier_targets_.objective(name))
                for name, tot, bad in (("availability", "total", "bad"), ("ttft", "ttft_total", "ttft_bad"),
                                       ("itl", "itl_total", "itl_bad"))
            }
        for name in sli.SLIS:
            month = status.windows["30d"][name]
            objective = tier_targets_.objective(name)
            status.budget_remaining[name] = (
                None if objective is None else sli.budget_remaining(month["bad"], month["total"], objective)
            )
            status.alerts[name] = sli.firing_alerts({w: status.windows[w][name]["burn_rate"] for w in sli.WINDOWS})
        if percentiles:
            filters = {"tier": labels["tier"]}
            if "tenant" in labels:
                filters["tenant__slug"] = labels["tenant"]
            if "model" in labels:
                filters["model"] = labels["model"]
            for window in PERCENTILE_WINDOWS:
                status.p95_ms[window] = {
                    "ttft": p95_ms(now=now, window=window, column="ttft_ms", filters=filters),
                    "itl": p95_ms(now=now, window=window, column="itl_ms", filters=filters),
                }
        result.append(status)
    return result


def _sli_view(*, good_total: tuple[int, int], bad: int, objective: float | None) -> dict:
    good, total = good_total
    return {
        "total": total, "bad": bad, "attainment": sli.attainment(good, total),
        "burn_rate": None if objective is None else sli.burn_rate(bad, total, objective),
    }
