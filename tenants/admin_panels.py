"""Reads for the tenant admin page's read-only panels: limits in force, this month's usage against
budgets, keys, SLO status, and the per-day series the charts draw.

Each panel is a bounded number of aggregate queries whatever the tenant's traffic or key count
(tests/tenants/test_admin_panels.py counts them).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Case, Count, F, IntegerField, Q, Sum, When
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.safestring import mark_safe

from billing.models import UsageRecord
from billing.selectors import tenant_spend, tenant_tokens
from common import admin_charts
from controlplane.slo import sli
from controlplane.slo.selectors import PLATFORM_BAD, slo_status, tier_targets

from .models import APIKey, Tenant
from .selectors import tenant_limits, tenant_usage

logger = logging.getLogger(__name__)

CHART_DAYS = 30
KEYS_SHOWN = 50  # most recently used first; the keys list has the rest
SLI_LABELS = {"availability": "availability", "ttft": "time to first token", "itl": "inter-token latency"}
SLI_COLOURS = {"availability": "#2e7d32", "ttft": "#1565c0", "itl": "#ef6c00"}

# (label, TenantLimits attribute, Tenant override field)
LIMIT_ROWS = (
    ("priority", "priority", "priority_override"),
    ("requests per minute", "requests_per_minute", "requests_per_minute_override"),
    ("tokens per minute", "tokens_per_minute", "tokens_per_minute_override"),
    ("concurrent requests", "max_concurrent_requests", "max_concurrent_requests_override"),
    ("monthly token budget", "monthly_token_budget", "monthly_token_budget_override"),
    ("monthly spend budget", "monthly_spend_budget", "monthly_spend_budget_override"),
)


@dataclass(frozen=True, slots=True)
class LimitRow:
    name: str
    value: object  # None: no limit
    source: str  # "tier <name>" or "override"


def limits_in_force(tenant: Tenant) -> list[LimitRow]:
    limits = tenant_limits(tenant=tenant)
    tier_source = f"tier {limits.tier}"
    rows = [
        LimitRow(label, getattr(limits, attr), "override" if getattr(tenant, field) is not None else tier_source)
        for label, attr, field in LIMIT_ROWS
    ]
    rows.append(LimitRow("budget enforcement", "hard" if limits.hard_budget else "soft",
                         "override" if tenant.budget_enforcement_override else tier_source))
    for label, value in (("SLO: TTFT p95 (ms)", limits.slo_ttft_p95_ms), ("SLO: ITL p95 (ms)", limits.slo_itl_p95_ms),
                         ("SLO: availability (%)", limits.slo_availability_pct)):
        rows.append(LimitRow(label, value, tier_source))  # SLO targets have no per-tenant override
    return rows


def _share(used: Decimal | int, budget: Decimal | int | None) -> dict:
    if not budget:
        return {"percent": None, "bar": 0, "over": False}
    percent = float(Decimal(used) / Decimal(budget) * 100)
    return {"percent": percent, "bar": min(percent, 100.0), "over": percent >= 100}


def month_usage(tenant: Tenant, *, now: dt.datetime) -> dict:
    """The ledger's month (what invoices bill) beside the limiter's count (what budgets enforce, in-flight included)."""
    start = now.astimezone(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    tokens = tenant_tokens(tenant=tenant, start=start, end=now)
    spend = tenant_spend(tenant=tenant, start=start, end=now)
    limits = tenant_limits(tenant=tenant)
    try:
        counted = tenant_usage(tenant=tenant)
    except Exception:  # the limiter's store down must not take the page with it; the ledger still answers
        logger.warning("limiter usage unavailable for the admin page", extra={"tenant": tenant.slug}, exc_info=True)
        counted = None
    return {
        "period_start": start.date(),
        "tokens": tokens, "token_budget": limits.monthly_token_budget,
        "token_share": _share(tokens, limits.monthly_token_budget),
        "spend": spend.quantize(Decimal("0.0001")), "spend_budget": limits.monthly_spend_budget,
        "spend_share": _share(spend, limits.monthly_spend_budget),
        "limiter_tokens": None if counted is None else counted["tokens"],
        "limiter_spend": None if counted is None else Decimal(counted["spend"]).quantize(Decimal("0.0001")),
    }


def _scopes(key: APIKey) -> str:
    models = ", ".join(key.allowed_models) or "any model"
    adapters = ", ".join(key.allowed_adapters) or "any adapter"
    return f"{'manage; ' if key.can_manage else ''}{models}; {adapters}"


def keys(tenant: Tenant) -> dict:
    qs = APIKey.objects.filter(tenant=tenant)
    shown = list(qs.order_by("revoked", F("last_used_at").desc(nulls_last=True), "-created_at")[:KEYS_SHOWN])
    total = len(shown) if len(shown) < KEYS_SHOWN else qs.count()
    return {"rows": [{"key": k, "scopes": _scopes(k)} for k in shown], "total": total, "shown": len(shown)}


def slo_rows(tenant: Tenant, *, now: dt.datetime) -> list[dict]:
    """One row per (tier, SLI) the tenant has traffic for: 1 h / 24 h / 30 d attainment, budget left, alerts."""
    rows = []
    for status in slo_status(tenant=tenant, group_by=("tenant", "tier"), now=now, percentiles=False):
        for name in sli.SLIS:
            objective = status.targets.objective(name)
            rows.append({
                "tier": status.tier, "sli": SLI_LABELS[name], "objective": objective,
                "objective_pct": None if objective is None else f"{objective * 100:g}",
                "attainment": {w: status.windows[w][name]["attainment"] for w in sli.REPORTED_WINDOWS},
                "budget_remaining": status.budget_remaining[name], "alerts": status.alerts[name],
                "total": status.windows["30d"][name]["total"],
            })
    return rows


def _days(now: dt.datetime) -> list[dt.date]:
    today = now.astimezone(dt.UTC).date()
    return [today - dt.timedelta(days=CHART_DAYS - 1 - i) for i in range(CHART_DAYS)]


def _window(now: dt.datetime) -> Q:
    start = dt.datetime.combine(_days(now)[0], dt.time(), tzinfo=dt.UTC)
    return Q(created_at__gte=start, created_at__lte=now)


def usage_charts(tenant: Tenant, *, now: dt.datetime) -> list[str]:
    """Tokens per day and spend per day (one chart per currency) over the last 30 UTC days: one query."""
    days = _days(now)
    rows = (UsageRecord.objects.filter(_window(now), tenant=tenant)
            .annotate(day=TruncDate("created_at", tzinfo=dt.UTC)).values("day", "currency")
            .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")), amount=Sum("amount"))
            .order_by("day", "currency"))
    tokens: dict[dt.date, int] = {}
    spend: dict[str, dict[dt.date, Decimal]] = {}
    for row in rows:
        tokens[row["day"]] = tokens.get(row["day"], 0) + int(row["tokens"] or 0)
        spend.setdefault(row["currency"], {})[row["day"]] = row["amount"] or Decimal(0)
    labels = [d.strftime("%m-%d") for d in days]
    charts = [admin_charts.bar_chart(title="Tokens per day (UTC)", labels=labels,
                                     values=[tokens.get(d, 0) for d in days], unit="tokens")]
    for currency in sorted(spend) or [""]:
        charts.append(admin_charts.bar_chart(
            title=f"Spend per day {currency}".rstrip(), labels=labels, colour="#79aec8", unit=currency,
            values=[spend.get(currency, {}).get(d, Decimal(0)) for d in days],
            value_format=lambda v: f"{Decimal(v).quantize(Decimal('0.0001'))}"))
    return charts


def _bad_case(column: str, targets: dict[str, float | None]) -> Case:
    """1 where the record missed its own tier's latency target (records carry the tier they were served at)."""
    whens = [When(**{"tier": name, f"{column}__gt": ms}, then=1) for name, ms in targets.items() if ms is not None]
    return Case(*whens, default=0, output_field=IntegerField())


def slo_chart(tenant: Tenant, *, now: dt.datetime) -> str:
    """Daily attainment per SLI over the last 30 UTC days (the same good/valid rules as slo.selectors): one query."""
    targets = tier_targets()
    ttft_targets = {n: t.ttft_ms for n, t in targets.items()}
    itl_targets = {n: t.itl_ms for n, t in targets.items()}
    ttft_valid = Q(ttft_ms__isnull=False, tier__in=[n for n, ms in ttft_targets.items() if ms is not None])
    itl_valid = Q(itl_ms__isnull=False, tier__in=[n for n, ms in itl_targets.items() if ms is not None])
    rows = (UsageRecord.objects.filter(_window(now), tenant=tenant)
            .annotate(day=TruncDate("created_at", tzinfo=dt.UTC)).values("day")
            .annotate(total=Count("id"), bad=Count("id", filter=PLATFORM_BAD),
                      ttft_total=Count("id", filter=ttft_valid),
                      ttft_bad=Sum(_bad_case("ttft_ms", ttft_targets), filter=ttft_valid),
                      itl_total=Count("id", filter=itl_valid),
                      itl_bad=Sum(_bad_case("itl_ms", itl_targets), filter=itl_valid))
            .order_by("day"))
    by_day = {row["day"]: row for row in rows}
    days = _days(now)
    series = []
    for name, total_key, bad_key in (("availability", "total", "bad"), ("ttft", "ttft_total", "ttft_bad"),
                                     ("itl", "itl_total", "itl_bad")):
        values = []
        for d in days:
            row = by_day.get(d)
            total = row[total_key] if row else 0
            values.append(sli.attainment(total - (row[bad_key] or 0), total) if total else None)
        series.append(admin_charts.Series(SLI_LABELS[name], values, SLI_COLOURS[name]))
    objective = targets[tenant.tier.name].objective("availability") if tenant.tier.name in targets else None
    return admin_charts.line_chart(title="SLO attainment per day (UTC)", labels=[d.strftime("%m-%d") for d in days],
                                   series=series, reference=objective, reference_label="availability objective")


def tenant_panels(tenant: Tenant, *, now: dt.datetime | None = None) -> dict:
    now = now or timezone.now()
    return {
        "limits": limits_in_force(tenant),
        "usage": month_usage(tenant, now=now),
        "keys": keys(tenant),
        "slo": slo_rows(tenant, now=now),
        # admin_charts escapes every text it draws, so its SVG may go into the page as it is.
        "usage_charts": [mark_safe(svg) for svg in usage_charts(tenant, now=now)],  # noqa: S308
        "slo_chart": mark_safe(slo_chart(tenant, now=now)),  # noqa: S308
    }
