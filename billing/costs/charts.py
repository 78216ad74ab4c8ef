"""The admin's unit-economics charts for one month: cost vs revenue per day, margin by tenant, $/M
tokens by deployment. Reads the report (billing/costs/report.py) and draws with common.admin_charts."""

from __future__ import annotations

from datetime import datetime

from django.utils.safestring import SafeString, mark_safe

from billing.costs.report import unit_economics
from common import admin_charts

TENANTS_SHOWN = 12  # the largest margins by size, either sign; the export has the rest


def _money(value) -> str:
    return f"{float(value):,.2f}"


def month_charts(*, start: datetime, end: datetime) -> list[SafeString]:
    """Three SVGs (the admin_charts functions escape every label, so they are safe to mark)."""
    daily = unit_economics(start=start, end=end, period="day")
    days = sorted({line.period for line in daily.tenants} | {line.period for line in daily.deployments})
    revenue = {d: 0.0 for d in days}
    cost = {d: 0.0 for d in days}
    for line in daily.tenants:
        revenue[line.period] += float(line.revenue)
    for line in daily.deployments:
        cost[line.period] += float(line.total_cost)  # idle included: what the fleet cost that day
    labels = [d.isoformat()[5:] for d in days]
    charts = [admin_charts.line_chart(
        title="Cost (idle included) vs revenue per day", labels=labels, y_min=0.0,
        y_max=max([*revenue.values(), *cost.values(), 0.01]) * 1.1, value_format=_money,
        series=[admin_charts.Series("revenue", [revenue[d] for d in days], "#2e7d32"),
                admin_charts.Series("cost", [cost[d] for d in days], "#c62828")])]
    monthly = unit_economics(start=start, end=end, period="month")
    margins: dict[str, float] = {}
    for line in monthly.tenants:
        margins[line.tenant] = margins.get(line.tenant, 0.0) + float(line.margin)
    shown = sorted(margins.items(), key=lambda item: -abs(item[1]))[:TENANTS_SHOWN]
    charts.append(admin_charts.bar_chart(
        title="Margin by tenant (revenue - attributed cost; negatives drawn at zero)",
        labels=[name for name, _ in shown], values=[value for _, value in shown], value_format=_money))
    per_mtok = [(f"{d.deployment}/{d.worker_class}", d) for d in monthly.deployments]
    charts.append(admin_charts.bar_chart(
        title="Cost per 1M output tokens by deployment / worker class", labels=[name for name, _ in per_mtok],
        values=[float(d.cost_per_m_output or 0) for _, d in per_mtok], value_format=_money))
    charts.append(admin_charts.bar_chart(
        title="Cost per 1M input tokens by deployment / worker class", labels=[name for name, _ in per_mtok],
        values=[float(d.cost_per_m_input or 0) for _, d in per_mtok], value_format=_money))
    return [mark_safe(svg) for svg in charts]  # noqa: S308 - admin_charts escapes all text it draws
