"""A read-only SLO status page: one row per tier, attainment / budget / burn columns computed per view."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from . import sli
from .models import TierSLO
from .selectors import SLOStatus, Targets, slo_status


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.2f}%"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


@admin.register(TierSLO)
class TierSLOAdmin(admin.ModelAdmin):
    list_display = ("name", "targets", "availability", "ttft", "itl", "budget_left", "burn_1h", "alerts")
    ordering = ("priority", "name")
    list_display_links = None

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        # One computation per page view (one aggregate query + percentiles per tier), shared by the rows.
        self._status = {s.tier: s for s in slo_status(group_by=("tier",), now=timezone.now())}
        extra = {"title": "SLO status by tier (attainment over 1 h / 24 h / 30 d)", **(extra_context or {})}
        return super().changelist_view(request, extra)

    def _of(self, tier: TierSLO) -> SLOStatus | None:
        return getattr(self, "_status", {}).get(tier.name)

    def _windows(self, tier: TierSLO, name: str) -> str:
        status = self._of(tier)
        if status is None:
            return "no requests"
        return " / ".join(_pct(status.windows[w][name]["attainment"]) for w in sli.REPORTED_WINDOWS)

    @admin.display(description="targets (TTFT p95, ITL p95, availability)")
    def targets(self, tier: TierSLO) -> str:
        t = Targets(tier.slo_ttft_p95_ms, tier.slo_itl_p95_ms, tier.slo_availability_pct)
        return f"{t.ttft_ms or '–'} ms, {t.itl_ms or '–'} ms, {t.availability_pct or '–'}%"

    @admin.display(description="availability 1h / 24h / 30d")
    def availability(self, tier: TierSLO) -> str:
        return self._windows(tier, "availability")

    @admin.display(description="TTFT within target 1h / 24h / 30d")
    def ttft(self, tier: TierSLO) -> str:
        return self._windows(tier, "ttft")

    @admin.display(description="ITL within target 1h / 24h / 30d")
    def itl(self, tier: TierSLO) -> str:
        return self._windows(tier, "itl")

    @admin.display(description="error budget left (30d): avail / TTFT / ITL")
    def budget_left(self, tier: TierSLO) -> str:
        status = self._of(tier)
        return "–" if status is None else " / ".join(_pct(status.budget_remaining[n]) for n in sli.SLIS)

    @admin.display(description="burn rate 1h: avail / TTFT / ITL")
    def burn_1h(self, tier: TierSLO) -> str:
        status = self._of(tier)
        return "–" if status is None else " / ".join(_rate(status.windows["1h"][n]["burn_rate"]) for n in sli.SLIS)

    @admin.display(description="firing alerts")
    def alerts(self, tier: TierSLO) -> str:
        status = self._of(tier)
        if status is None:
            return ""
        return ", ".join(f"{n}:{a}" for n in sli.SLIS for a in status.alerts[n]) or "none"
