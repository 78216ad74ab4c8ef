"""The unit-economics report: revenue (the ledger), attributed cost, margin; and per deployment and
worker class, $/M tokens, utilisation and idle. Reads only; returns plain dataclasses.

Revenue is the ledger's exact amounts (invoices round them per line, so a month's revenue here
equals the sum of its invoice lines' exact amounts). Costs are what `cost_hour_rebuild` stored:
a request's cost sits in the hour it started, like its revenue, so days and months line up.
Revenue and cost are joined where their currencies agree; a tenant billed in one currency on
workers rated in another gets two lines, never a converted one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import BooleanField, Count, ExpressionWrapper, Q, Sum
from django.db.models.functions import TruncDay, TruncMonth

from billing.costs.attribute import kind_of
from billing.models import ReplicaHourCost, RequestCost, UsageRecord
from billing.models.costs import COST_PLACES
from billing.money import AMOUNT_PLACES, ZERO, exact_sum

PERIODS = ("month", "day")
MTOK = Decimal(1_000_000)
SECONDS_PER_HOUR = Decimal(3600)
PER_MTOK_PLACES = Decimal("0.000001")
RATIO_PLACES = Decimal("0.0001")


@dataclass(frozen=True, slots=True)
class TenantLine:
    period: date  # the day, or the month's first day
    tenant_id: int
    tenant: str  # slug
    model: str
    adapter: str
    tier: str
    kind: str  # online, batch, embeddings, batch-embeddings
    currency: str
    requests: int
    input_tokens: int  # prompt tokens not served from the cache
    cached_tokens: int
    output_tokens: int
    revenue: Decimal  # the ledger's exact amount
    cost: Decimal  # attributed cost
    margin: Decimal  # revenue - cost
    margin_percent: Decimal | None  # margin / revenue x 100, two places; None without revenue


@dataclass(frozen=True, slots=True)
class DeploymentLine:
    period: date
    deployment: str
    worker_class: str
    currency: str
    replica_hours: Decimal  # ready time
    busy_hours: Decimal  # the requests' work within it
    utilisation: Decimal | None  # busy / ready; None with no ready time
    requests: int
    input_tokens: int
    output_tokens: int
    total_cost: Decimal  # ready hours x rate
    attributed_cost: Decimal
    idle_cost: Decimal
    cost_per_m_input: Decimal | None  # the input side of attributed cost per 1M input tokens
    cost_per_m_output: Decimal | None
    unrated_hours: Decimal  # ready time of a class with no rate: costed at zero, flagged


@dataclass(frozen=True, slots=True)
class Summary:
    currency: str
    revenue: Decimal
    attributed_cost: Decimal
    idle_cost: Decimal
    total_cost: Decimal
    margin: Decimal  # revenue - total cost (idle included)


@dataclass(frozen=True, slots=True)
class UnitEconomics:
    start: datetime
    end: datetime
    period: str
    tenants: list[TenantLine]
    deployments: list[DeploymentLine]
    summary: list[Summary]
    unattributed_requests: int  # usage with no cost row: no known replica, or its hour not rebuilt yet
    unrated_hours: Decimal
    notes: list[str] = field(default_factory=list)


def _trunc(period: str, name: str):
    if period not in PERIODS:
        raise ValueError(f"period must be one of {PERIODS}, not {period!r}")
    return (TruncMonth if period == "month" else TruncDay)(name, tzinfo=UTC)


def _day(value) -> date:
    return value.astimezone(UTC).date() if isinstance(value, datetime) else value


def _places(value, places: int) -> Decimal:
    """A sum at its column's places: SQLite's sums come back at whatever exponent it chose."""
    return Decimal(value or 0).quantize(Decimal(1).scaleb(-places))


def _ratio(numerator: Decimal, denominator: Decimal, places: Decimal) -> Decimal | None:
    if not denominator:
        return None
    return (Decimal(numerator) / Decimal(denominator)).quantize(places, rounding=ROUND_HALF_UP)


def _tenant_lines(start, end, period) -> list[TenantLine]:
    batch = ExpressionWrapper(~Q(batch_id=""), output_field=BooleanField())
    revenue = (UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end).order_by()
               .annotate(p=_trunc(period, "created_at"), is_batch=batch)
               .values("p", "tenant_id", "tenant__slug", "model", "adapter", "tier", "is_batch", "embeddings",
                       "currency")
               .annotate(requests=Count("id"), prompt=Sum("prompt_tokens"), cached=Sum("cached_tokens"),
                         output=Sum("completion_tokens"), revenue=Sum("amount")))
    costs = (RequestCost.objects.filter(hour__gte=start, hour__lt=end).order_by()
             .annotate(p=_trunc(period, "hour"))
             .values("p", "tenant_id", "tenant__slug", "model", "adapter", "tier", "kind", "currency")
             .annotate(cost=Sum("cost")))
    lines: dict[tuple, dict] = {}
    for row in revenue:
        kind = kind_of(batch_id="b" if row["is_batch"] else "", embeddings=row["embeddings"])
        key = (_day(row["p"]), row["tenant_id"], row["model"], row["adapter"], row["tier"], kind, row["currency"])
        acc = lines.setdefault(key, {"slug": row["tenant__slug"], "requests": 0, "prompt": 0, "cached": 0,
                                     "output": 0, "revenue": [], "cost": []})
        acc["requests"] += row["requests"]
        acc["prompt"] += row["prompt"] or 0
        acc["cached"] += row["cached"] or 0
        acc["output"] += row["output"] or 0
        acc["revenue"].append(row["revenue"] or ZERO)
    for row in costs:
        key = (_day(row["p"]), row["tenant_id"], row["model"], row["adapter"], row["tier"], row["kind"], row["currency"])
        acc = lines.setdefault(key, {"slug": row["tenant__slug"], "requests": 0, "prompt": 0, "cached": 0,
                                     "output": 0, "revenue": [], "cost": []})
        acc["cost"].append(row["cost"] or ZERO)
    out = []
    for key, acc in sorted(lines.items(), key=lambda item: tuple(str(part) for part in item[0])):
        revenue_sum = _places(exact_sum(acc["revenue"]), AMOUNT_PLACES)
        cost_sum = _places(exact_sum(acc["cost"]), COST_PLACES)
        margin = exact_sum([revenue_sum, -cost_sum])
        out.append(TenantLine(
            period=key[0], tenant_id=key[1], tenant=acc["slug"], model=key[2], adapter=key[3], tier=key[4],
            kind=key[5], currency=key[6], requests=acc["requests"], input_tokens=acc["prompt"] - acc["cached"],
            cached_tokens=acc["cached"], output_tokens=acc["output"], revenue=revenue_sum, cost=cost_sum,
            margin=margin, margin_percent=_ratio(margin * 100, revenue_sum, Decimal("0.01")),
        ))
    return out


def _deployment_lines(start, end, period) -> list[DeploymentLine]:
    keys = ("p", "deployment", "worker_class", "currency")
    hours = (ReplicaHourCost.objects.filter(hour__gte=start, hour__lt=end).order_by()
             .annotate(p=_trunc(period, "hour")).values(*keys)
             .annotate(up=Sum("up_seconds"), busy=Sum("busy_seconds"), total=Sum("total_cost"),
                       attributed=Sum("attributed_cost"), idle=Sum("idle_cost"), requests=Sum("requests"),
                       unrated=Sum("up_seconds", filter=Q(unrated=True))))
    served = {
        tuple(_day(row[k]) if k == "p" else row[k] for k in keys): row
        for row in (RequestCost.objects.filter(hour__gte=start, hour__lt=end).order_by()
                    .annotate(p=_trunc(period, "hour")).values(*keys)
                    .annotate(input_cost=Sum("input_cost"), output_cost=Sum("output_cost"),
                              prompt=Sum("usage__prompt_tokens"), cached=Sum("usage__cached_tokens"),
                              output=Sum("usage__completion_tokens")))
    }
    out = []
    for row in sorted(hours, key=lambda r: (r["p"], r["deployment"], r["worker_class"], r["currency"])):
        key = (_day(row["p"]), row["deployment"], row["worker_class"], row["currency"])
        work = served.get(key, {})
        input_tokens = (work.get("prompt") or 0) - (work.get("cached") or 0)
        output_tokens = work.get("output") or 0
        up, busy = row["up"] or ZERO, row["busy"] or ZERO
        out.append(DeploymentLine(
            period=key[0], deployment=key[1], worker_class=key[2], currency=key[3],
            replica_hours=(up / SECONDS_PER_HOUR).quantize(RATIO_PLACES, rounding=ROUND_HALF_UP),
            busy_hours=(busy / SECONDS_PER_HOUR).quantize(RATIO_PLACES, rounding=ROUND_HALF_UP),
            utilisation=_ratio(busy, up, RATIO_PLACES), requests=row["requests"] or 0,
            input_tokens=input_tokens, output_tokens=output_tokens, total_cost=_places(row["total"], COST_PLACES),
            attributed_cost=_places(row["attributed"], COST_PLACES), idle_cost=_places(row["idle"], COST_PLACES),
            cost_per_m_input=_ratio((work.get("input_cost") or ZERO) * MTOK, input_tokens, PER_MTOK_PLACES),
            cost_per_m_output=_ratio((work.get("output_cost") or ZERO) * MTOK, output_tokens, PER_MTOK_PLACES),
            unrated_hours=((row["unrated"] or ZERO) / SECONDS_PER_HOUR).quantize(RATIO_PLACES, rounding=ROUND_HALF_UP),
        ))
    return out


def _summary(tenants: list[TenantLine], deployments: list[DeploymentLine]) -> list[Summary]:
    acc: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for line in tenants:
        acc[line.currency]["revenue"].append(line.revenue)
    for line in deployments:
        for name in ("attributed_cost", "idle_cost", "total_cost"):
            acc[line.currency][name].append(getattr(line, name))
    out = []
    for currency in sorted(acc):
        sums = {name: exact_sum(acc[currency][name]) for name in ("revenue", "attributed_cost", "idle_cost",
                                                                  "total_cost")}
        out.append(Summary(currency=currency, **sums, margin=exact_sum([sums["revenue"], -sums["total_cost"]])))
    return out


def unit_economics(*, start: datetime, end: datetime, period: str = "month") -> UnitEconomics:
    """The report for [start, end), per `period` ("month" or "day")."""
    tenants = _tenant_lines(start, end, period)
    deployments = _deployment_lines(start, end, period)
    unattributed = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end, cost__isnull=True).count()
    unrated = exact_sum(line.unrated_hours for line in deployments)
    notes = []
    if unattributed:
        notes.append(f"{unattributed} requests have no cost: no known replica served them, or their hour "
                     "is not rebuilt yet (manage.py unit_economics --rebuild)")
    if unrated:
        notes.append(f"{unrated} replica-hours ran on worker classes with no rate and are costed at zero")
    return UnitEconomics(start=start, end=end, period=period, tenants=tenants, deployments=deployments,
                         summary=_summary(tenants, deployments), unattributed_requests=unattributed,
                         unrated_hours=unrated, notes=notes)


__all__ = ["DeploymentLine", "PERIODS", "Summary", "TenantLine", "UnitEconomics", "unit_economics"]
