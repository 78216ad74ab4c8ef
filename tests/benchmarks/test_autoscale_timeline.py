"""benchmarks.autoscale's arithmetic: windows, phases, p95s, recovery and cost from recorded samples."""

from __future__ import annotations

from argparse import Namespace
from decimal import Decimal

from benchmarks.autoscale import WINDOW, Recorder, summarize, table, timeline


def recorded() -> Recorder:
    rec = Recorder()
    # 0-30 s baseline at 1 replica; load from 30 s; a 2nd replica ready at 52 s; load stops at 90 s;
    # back to 1 at 115 s; the run ends at 129 s.
    for t in range(130):
        ready = 2 if 52 <= t < 115 else 1
        rec.samples.append({"t": float(t), "desired": 2 if 45 <= t < 110 else 1, "ready": ready,
                            "load_clients": 6 if 30 <= t < 90 else 0, "load_served": t,
                            "cost_per_minute": float(Decimal("0.60") * ready / 60)})
    for s in range(0, 130, 2):  # a premium request every 2 s: slow while queued behind the load
        slow = 30 <= s < 60
        rec.premium.append((float(s), 2.5 if slow else 0.2))
    rec.premium.append((31.0, None))  # one failed
    return rec


def test_rows_are_ten_second_windows_with_phases_p95s_and_cost():
    rec = recorded()
    rows = timeline(rec, step_at=30.0, step_end=90.0, slo_ms=1000)
    assert [r["t"] for r in rows] == [float(t) for t in range(0, 130, 10)]
    assert [r["phase"] for r in rows] == ["baseline"] * 3 + ["step"] * 6 + ["after"] * 4
    assert rows[3]["premium_ttft_p95_ms"] == 2500 and rows[3]["premium_failed"] == 1 and not rows[3]["within_slo"]
    assert rows[6]["premium_ttft_p95_ms"] == 200 and rows[6]["within_slo"]
    assert rows[3]["load_clients"] == 6 and rows[0]["load_clients"] == 0
    # cost per minute: the window's mean of ready x rate / 60 (50-59 s: 2 samples at 1, 8 at 2 replicas)
    assert abs(rows[5]["cost_per_minute"] - (2 * 0.01 + 8 * 0.02) / 10) < 1e-12


def test_the_summary_times_growth_shrink_and_recovery():
    rec = recorded()
    rows = timeline(rec, step_at=30.0, step_end=90.0, slo_ms=1000)
    d = summarize(rec, rows, 30.0, 90.0, 1000, [{"at": 15, "from": 1, "to": 2, "reason": "queue"},
                                                {"at": 80, "from": 2, "to": 1, "reason": "low"}],
                  Namespace(load_clients=6, baseline_seconds=30, step_seconds=60, worker_threads=1, max_num_seqs=2), Decimal("0.60"))
    assert d["grown_to_2_after_s"] == 22 and d["back_to_1_after_s"] == 25 and d["peak_ready"] == 2
    assert d["premium_within_slo_after_s"] == 30  # the 60-69 s window is the first of the good ones
    p = d["premium_ttft_p95_ms"]
    assert p["baseline"] < 1000 < p["step_until_grown"] and p["after"] < 1000
    assert d["premium_failed"] == 1 and d["ups"] == 1 and d["downs"] == 1
    assert d["cost_usd"] == round(sum(r["cost_per_minute"] * WINDOW / 60 for r in rows), 4)
    text = table({**d, "environment": {"cpu": "test cpu", "cpu_capability": "x", "when": "now"}})
    assert "grew to 2 ready replicas **22 s**" in text and "| 30 | step | 6 | 1 | 1 | 6 | 2500 |" in text


def test_a_window_while_the_load_winds_down_is_not_a_recovery():
    from benchmarks.autoscale import recovery

    rows = [{"t": 30.0, "phase": "step", "load_clients": 6, "premium_ttft_p95_ms": 1500, "within_slo": False},
            {"t": 40.0, "phase": "step", "load_clients": 6, "premium_ttft_p95_ms": 1400, "within_slo": False},
            {"t": 50.0, "phase": "step", "load_clients": 2, "premium_ttft_p95_ms": 300, "within_slo": True}]
    assert recovery(rows, 30.0, 6) is None
    rows[1].update(premium_ttft_p95_ms=400, within_slo=True)
    assert recovery(rows, 30.0, 6) == 10.0
