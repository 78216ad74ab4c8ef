"""The SLO maths on known data (no database)."""

from __future__ import annotations

import pytest

from controlplane.slo import sli


def test_percentile_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert sli.percentile(values, 95) == 95
    assert sli.percentile(values, 50) == 50
    assert sli.percentile([7.0], 95) == 7.0
    assert sli.percentile([3, 1, 2], 100) == 3
    assert sli.percentile([], 95) is None
    assert sli.percentile_rank(20, 95) == 18  # the 19th of 20
    with pytest.raises(ValueError, match="q"):
        sli.percentile([1], 101)


def test_attainment_and_no_data():
    assert sli.attainment(95, 100) == 0.95
    assert sli.attainment(0, 0) is None  # no traffic is not 100%
    with pytest.raises(ValueError, match="good"):
        sli.attainment(5, 4)


def test_burn_rate_and_budget():
    # 99.9% objective: a 0.1% error ratio burns exactly on budget.
    assert sli.burn_rate(1, 1000, 0.999) == pytest.approx(1.0)
    assert sli.burn_rate(0, 1000, 0.999) == 0
    assert sli.burn_rate(0, 0, 0.999) is None
    assert sli.budget_remaining(1, 2000, 0.999) == pytest.approx(0.5)
    assert sli.budget_remaining(3, 1000, 0.999) == pytest.approx(-2.0)  # overspent
    # latency "p95" SLO: 95% objective, budget 5%; 90% within target burns twice as fast
    assert sli.burn_rate(10, 100, sli.LATENCY_OBJECTIVE) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="objective"):
        sli.error_budget(1.0)


def test_workbook_table_spends_the_documented_share_of_the_budget():
    table = {a.name: a for a in sli.BURN_ALERTS}
    assert (table["fast_burn"].long_window, table["fast_burn"].short_window, table["fast_burn"].factor) == ("1h", "5m", 14.4)
    assert table["fast_burn"].budget_fraction == pytest.approx(0.02)
    assert table["slow_burn"].budget_fraction == pytest.approx(0.05)
    assert table["budget_drain"].budget_fraction == pytest.approx(0.10)
    assert [a.severity for a in sli.BURN_ALERTS] == ["page", "page", "ticket"]


@pytest.mark.parametrize(
    ("long", "short", "fires"),
    [(15.0, 15.0, True), (14.4, 20.0, False), (20.0, 14.0, False), (14.5, 14.5, True), (None, 20.0, False)],
)
def test_fast_burn_fires_only_when_both_windows_exceed(long, short, fires):
    fast = sli.BURN_ALERTS[0]
    assert sli.alert_firing(fast, {"1h": long, "5m": short}) is fires


def test_alert_fires_then_clears_as_the_short_window_recovers():
    """An outage at 2% errors on a 99.9% SLO (burn 20×) pages; once it stops, the 5m window drops
    below 14.4 and the page clears although the 1h window still remembers the outage."""
    objective = 0.999
    during = {w: sli.burn_rate(20, 1000, objective) for w in sli.WINDOWS}
    assert "fast_burn" in sli.firing_alerts(during)
    after = dict(during, **{"5m": sli.burn_rate(0, 1000, objective)})
    assert "fast_burn" not in sli.firing_alerts(after)
    # a slow leak at 0.7% (7×) pages slow-burn but not fast-burn
    leak = {w: sli.burn_rate(7, 1000, objective) for w in sli.WINDOWS}
    assert sli.firing_alerts(leak) == ["slow_burn", "budget_drain"]


def test_objectives():
    assert sli.objective_for("availability", availability_pct=99.9, target_ms=None) == pytest.approx(0.999)
    assert sli.objective_for("ttft", availability_pct=None, target_ms=500) == 0.95
    assert sli.objective_for("itl", availability_pct=99.9, target_ms=None) is None
