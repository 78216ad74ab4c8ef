"""SLO maths as pure functions: attainment, error budgets, burn rates, multi-window alerts.

Every SLI here is a ratio of good events to valid events (Google's SRE workbook, ch. 2 and 5):

- availability: a request is bad when the platform failed it (5xx, an engine error, a stream that
  broke); 4xx refusals (bad requests, rate limits, load shedding) and client disconnects are not
  the platform's failure and count as good. Objective: the tier's `slo_availability_pct`.
- ttft / itl: a tier's "p95 ≤ X ms" promise is read as "95% of requests meet X ms", so the SLI is
  the fraction of requests whose TTFT (or mean inter-token latency) is ≤ X and the objective is
  0.95. This keeps latency and availability on one footing: each has an error budget (1 − objective)
  and a burn rate (bad fraction ÷ budget).

Burn rate 1 spends exactly the period's budget over the period (30 days). The alert table is the
workbook's multi-window, multi-burn-rate one: an alert fires only while BOTH its long window (the
budget really is burning) and its short window (it is still burning now) exceed the factor, so it
clears within the short window once the problem stops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SLO_PERIOD_SECONDS = 30 * 24 * 3600
LATENCY_OBJECTIVE = 0.95  # a "p95" target: 95% of requests within it

# Windows the selectors compute, in seconds. 1h / 24h / 30d are reported; the others feed alerts.
WINDOWS: dict[str, int] = {
    "5m": 300, "30m": 1800, "1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600, "3d": 3 * 24 * 3600,
    "30d": SLO_PERIOD_SECONDS,
}
REPORTED_WINDOWS = ("1h", "24h", "30d")
SLIS = ("availability", "ttft", "itl")


@dataclass(frozen=True, slots=True)
class BurnAlert:
    name: str
    severity: str  # "page" or "ticket"
    long_window: str
    short_window: str
    factor: float  # burn-rate threshold, applied to both windows

    @property
    def budget_fraction(self) -> float:
        """Share of the period's budget spent when the long window burns at exactly `factor`."""
        return budget_spent(self.factor, WINDOWS[self.long_window])


# The SRE workbook's recommended table (ch. 5, "Multiwindow, Multi-Burn-Rate Alerts").
BURN_ALERTS: tuple[BurnAlert, ...] = (
    BurnAlert("fast_burn", "page", "1h", "5m", 14.4),  # 2% of a 30-day budget in 1 h
    BurnAlert("slow_burn", "page", "6h", "30m", 6.0),  # 5% in 6 h
    BurnAlert("budget_drain", "ticket", "3d", "6h", 1.0),  # 10% in 3 days
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of unsorted values; None for no values.

    Nearest rank is what `ORDER BY v OFFSET k` gives in SQL, so Python and the database agree.
    """
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"q: must be in [0, 100], got {q}")
    ordered = sorted(values)
    return ordered[percentile_rank(len(ordered), q)]


def percentile_rank(n: int, q: float) -> int:
    """0-based index of the nearest-rank q-th percentile among n sorted values (n >= 1)."""
    return max(0, math.ceil(q / 100 * n) - 1)


def attainment(good: int, total: int) -> float | None:
    """Fraction of valid events that were good; None when nothing happened (no data is not 100%)."""
    if good < 0 or total < 0 or good > total:
        raise ValueError(f"good: must be in [0, total], got good={good} total={total}")
    return None if total == 0 else good / total


def error_budget(objective: float) -> float:
    if not 0 < objective < 1:
        raise ValueError(f"objective: must be in (0, 1), got {objective}")
    return 1.0 - objective


def burn_rate(bad: int, total: int, objective: float) -> float | None:
    """How fast the window spends the budget: bad fraction ÷ (1 − objective). 1 = exactly on budget."""
    if total == 0:
        return None
    return (bad / total) / error_budget(objective)


def budget_remaining(bad: int, total: int, objective: float) -> float | None:
    """Share of the period's error budget left, from the whole period's counts (negative = overspent)."""
    rate = burn_rate(bad, total, objective)
    return None if rate is None else 1.0 - rate


def budget_spent(rate: float, window_seconds: int, period_seconds: int = SLO_PERIOD_SECONDS) -> float:
    """Share of the period's budget a window spends burning at `rate` (traffic assumed even)."""
    return rate * window_seconds / period_seconds


def alert_firing(alert: BurnAlert, burn_rates: Mapping[str, float | None]) -> bool:
    """True while both of the alert's windows burn faster than its factor (strictly, like PromQL's >)."""
    long, short = burn_rates.get(alert.long_window), burn_rates.get(alert.short_window)
    return long is not None and short is not None and long > alert.factor and short > alert.factor


def firing_alerts(burn_rates: Mapping[str, float | None]) -> list[str]:
    return [a.name for a in BURN_ALERTS if alert_firing(a, burn_rates)]


def objective_for(sli: str, *, availability_pct: float | None, target_ms: float | None) -> float | None:
    """The SLI's objective as a fraction, or None when the tier sets no target for it."""
    if sli == "availability":
        return None if availability_pct is None else float(availability_pct) / 100.0
    return None if target_ms is None else LATENCY_OBJECTIVE
