"""deploy/prometheus and deploy/grafana: generated from the code, metrics that exist, thresholds = the maths."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from controlplane.slo import deploy_files, sli

CONDITION = re.compile(
    r"tier_sli:tessera_error_ratio:rate(\w+) > on\(tier, sli\) group_left\(\) \(([\d.]+) \* \(1 - max by \(tier, sli\) "
    r"\(tessera_slo_objective\)\)\)"
)


def test_committed_files_are_the_generated_ones():
    assert deploy_files.RULES_PATH.read_text() == deploy_files.render_rules()
    assert deploy_files.DASHBOARD_PATH.read_text() == deploy_files.render_dashboard()


def _alerts() -> list[dict]:
    groups = yaml.safe_load(deploy_files.RULES_PATH.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def _parsed(alert: dict) -> list[tuple[str, float]]:
    return [(w, float(f)) for w, f in CONDITION.findall(alert["expr"])]


def test_alert_windows_and_factors_are_the_workbook_table():
    alerts = _alerts()
    assert len(alerts) == len(sli.BURN_ALERTS)
    for alert, expected in zip(alerts, sli.BURN_ALERTS, strict=True):
        assert _parsed(alert) == [(expected.long_window, expected.factor), (expected.short_window, expected.factor)]
        assert " and " in " ".join(alert["expr"].split())
        assert alert["labels"]["severity"] == expected.severity


def _rule_fires(alert: dict, error_ratio: dict[str, float], objective: float) -> bool:
    """Evaluate the rule's condition as Prometheus would, on synthetic error ratios."""
    return all(error_ratio[w] > factor * (1 - objective) for w, factor in _parsed(alert))


@pytest.mark.parametrize("objective", [0.999, 0.995, 0.95])
@pytest.mark.parametrize("scale", [0.5, 0.99, 1.01, 3.0])
def test_rules_fire_and_clear_exactly_where_the_maths_does(objective, scale):
    budget = 1 - objective
    for alert, spec in zip(_alerts(), sli.BURN_ALERTS, strict=True):
        # both windows at scale × the threshold: fires iff scale > 1
        ratios = {w: min(1.0, spec.factor * budget * scale) for w in sli.WINDOWS}
        burns = {w: r / budget for w, r in ratios.items()}
        assert _rule_fires(alert, ratios, objective) == sli.alert_firing(spec, burns)
        if spec.factor * budget * scale < 1.0:
            assert _rule_fires(alert, ratios, objective) is (scale > 1)
        # the short window recovers: the alert clears in both
        cleared = dict(ratios, **{spec.short_window: 0.0})
        assert not _rule_fires(alert, cleared, objective)
        assert not sli.alert_firing(spec, {w: r / budget for w, r in cleared.items()})


def _code_metric_names(settings) -> set[str]:
    from controlplane.slo import metrics
    from dataplane.worker.metrics import WorkerMetrics

    settings.TESSERA_WORKERS = "http://127.0.0.1:9"
    names = set()
    for registry in (WorkerMetrics("m", lambda: None).registry, metrics.REGISTRY):
        for family in registry.collect():
            names.add(family.name)
            names.update(s.name for s in family.samples)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


@pytest.mark.django_db
def test_every_dashboard_and_rule_metric_exists_in_code(settings):
    from controlplane.slo.metrics import SLO_COLLECTOR

    SLO_COLLECTOR.clear()
    known = _code_metric_names(settings)
    groups = yaml.safe_load(deploy_files.RULES_PATH.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    exprs = [t["expr"] for p in json.loads(deploy_files.DASHBOARD_PATH.read_text())["panels"] for t in p["targets"]]
    exprs += [r["expr"] for g in groups for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\b(?:tier_sli:)?tessera[:_][a-z_:0-9]*[a-z0-9_]", e)}
    missing = {m for m in used if m not in known and m not in recorded}
    assert not missing, f"metrics used in deploy/ but not defined in code: {sorted(missing)}"
    # the dashboard covers what the issue asks for
    titles = " ".join(p["title"] for p in json.loads(deploy_files.DASHBOARD_PATH.read_text())["panels"]).lower()
    for needle in ("ttft", "itl", "throughput", "queue", "prefix-cache", "kv-cache", "preemptions", "error rate", "slo attainment"):
        assert needle in titles
