"""Reads. Every selector takes the tenant it reads for (the one exception, finding a tenant from
a key, lives in tenants/auth.py)."""

from __future__ import annotations

import datetime as dt

from django.db.models import QuerySet

from billing.selectors import tenant_spend
from common.errors import NotFound

# TenantLimits is defined beside the limiters that consume it (a lower layer); importable from here too.
from .limits import get_limiter, period_start
from .limits.base import TenantLimits, from_nano
from .models import APIKey, BudgetEnforcement, Tenant, Tier


def _pick(override, inherited):
    return inherited if override is None else override


def tenant_limits(*, tenant: Tenant) -> TenantLimits:
    tier: Tier = tenant.tier
    enforcement = tenant.budget_enforcement_override or tier.budget_enforcement
    return TenantLimits(
        tier=tier.name,
        priority=_pick(tenant.priority_override, tier.priority),
        requests_per_minute=_pick(tenant.requests_per_minute_override, tier.requests_per_minute),
        tokens_per_minute=_pick(tenant.tokens_per_minute_override, tier.tokens_per_minute),
        max_concurrent_requests=_pick(tenant.max_concurrent_requests_override, tier.max_concurrent_requests),
        monthly_token_budget=_pick(tenant.monthly_token_budget_override, tier.monthly_token_budget),
        monthly_spend_budget=_pick(tenant.monthly_spend_budget_override, tier.monthly_spend_budget),
        hard_budget=enforcement == BudgetEnforcement.HARD,
        slo_ttft_p95_ms=tier.slo_ttft_p95_ms,
        slo_itl_p95_ms=tier.slo_itl_p95_ms,
        slo_availability_pct=tier.slo_availability_pct,
        fair_share_weight=tier.fair_share_weight,
    )


def api_key_list(*, tenant: Tenant) -> QuerySet[APIKey]:
    return APIKey.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def api_key_get(*, tenant: Tenant, key_id: int) -> APIKey:
    """A key of this tenant; another tenant's key is indistinguishable from a missing one."""
    try:
        return APIKey.objects.select_related("tenant").get(tenant=tenant, pk=key_id)
    except (APIKey.DoesNotExist, ValueError, TypeError):
        raise NotFound("No such API key.") from None


def tenant_get(*, slug: str) -> Tenant:
    """Operator lookup by slug."""
    try:
        return Tenant.objects.select_related("tier").get(slug=slug)
    except Tenant.DoesNotExist:
        raise NotFound(f"No tenant {slug!r}.") from None


def tenant_id_by_id_or_slug(raw: str) -> int | None:
    """The id of the tenant an operator named by id or by slug (exports' `tenant=`), or None.

    Only ASCII digits, fewer than 19 of them, are read as an id: `str.isdigit()` takes "²", which
    `int()` refuses, and 19 digits may pass a bigint; anything else is looked up as a slug.
    """
    lookup = {"pk": int(raw)} if raw.isascii() and raw.isdigit() and len(raw) < 19 else {"slug": raw}
    return Tenant.objects.filter(**lookup).values_list("pk", flat=True).first()


def tier_get(*, name: str) -> Tier:
    try:
        return Tier.objects.get(name=name)
    except Tier.DoesNotExist:
        raise NotFound(f"No tier {name!r}.") from None


def tenant_usage(*, tenant: Tenant) -> dict:
    """This month's usage as the limiter counts it, and the ledger's figure (billed so far)."""
    period = period_start()
    tokens, spend_nano = get_limiter().usage_sync(tenant_id=tenant.pk, period=period)
    start = dt.datetime(period.year, period.month, 1, tzinfo=dt.UTC)
    billed = tenant_spend(tenant=tenant, start=start, end=dt.datetime.now(dt.UTC))
    limits = tenant_limits(tenant=tenant)
    return {
        "period_start": period,
        "tokens": tokens,
        "spend": from_nano(spend_nano),
        "billed_spend": billed,
        "monthly_token_budget": limits.monthly_token_budget,
        "monthly_spend_budget": limits.monthly_spend_budget,
    }


def tenant_list() -> QuerySet[Tenant]:
    """Operators only (the views check)."""
    return Tenant.objects.select_related("tier").order_by("slug")
