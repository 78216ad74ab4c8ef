"""Generates deploy/prometheus/tessera-slo-rules.yml and deploy/grafana/tessera-dashboard.json.

Generated from `sli.BURN_ALERTS` and the metric names in code, so the alert thresholds are the
SLO maths and not a copy of it; tests check the committed files equal this output.
`python -m controlplane.slo.deploy_files` rewrites both.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from . import sli

ROOT = Path(__file__).resolve().parents[2]
RULES_PATH = ROOT / "deploy" / "prometheus" / "tessera-slo-rules.yml"
DASHBOARD_PATH = ROOT / "deploy" / "grafana" / "tessera-dashboard.json"

RATIO = "tier_sli:tessera_error_ratio:rate{window}"
OBJECTIVE = "max by (tier, sli) (tessera_slo_objective)"


def _alert_windows() -> list[str]:
    return sorted({w for a in sli.BURN_ALERTS for w in (a.long_window, a.short_window)}, key=sli.WINDOWS.get)


def burn_condition(window: str, factor: float) -> str:
    return f"{RATIO.format(window=window)} > on(tier, sli) group_left() ({factor:g} * (1 - {OBJECTIVE}))"


def alert_rules() -> dict:
    events = "tessera_gateway_sli_events_total"
    recording = [
        {
            "record": RATIO.format(window=w),
            "expr": f'sum by (tier, sli) (rate({events}{{outcome="bad"}}[{w}]))\n'
                    f"/\nsum by (tier, sli) (rate({events}[{w}]))",
        }
        for w in _alert_windows()
    ]
    alerts = []
    for a in sli.BURN_ALERTS:
        name = "TesseraSLO" + "".join(part.title() for part in a.name.split("_"))
        alerts.append({
            "alert": name,
            "expr": f"(\n  {burn_condition(a.long_window, a.factor)}\n)\nand\n(\n  {burn_condition(a.short_window, a.factor)}\n)",
            "labels": {"severity": a.severity, "long_window": a.long_window, "short_window": a.short_window,
                       "burn_factor": f"{a.factor:g}"},
            "annotations": {
                "summary": f"{{{{ $labels.tier }}}} tier is burning its {{{{ $labels.sli }}}} error budget "
                           f"{a.factor:g}x too fast",
                "description": f"Over {a.long_window} and {a.short_window} the {{{{ $labels.sli }}}} error ratio of tier "
                               f"{{{{ $labels.tier }}}} exceeds {a.factor:g} times its budget: at this rate "
                               f"{a.budget_fraction:.0%} of the 30-day budget goes in {a.long_window}. See docs/slo.md.",
            },
        })
    return {"groups": [
        {"name": "tessera-slo-recording", "rules": recording},
        {"name": "tessera-slo-burn-rate", "rules": alerts},
    ]}


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int) -> dict:
    return {
        "id": pid, "type": "timeseries", "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": legend} for i, (e, legend) in enumerate(exprs)],
    }


def _quantile(metric: str, by: str) -> str:
    return f"histogram_quantile(0.95, sum by (le, {by}) (rate({metric}_bucket[5m])))"


PANELS: list[tuple[str, list[tuple[str, str]], str]] = [
    ("TTFT p95 by priority (worker)", [(_quantile("tessera:time_to_first_token_seconds", "priority"), "priority {{priority}}")], "s"),
    ("ITL p95 by priority (worker)", [(_quantile("tessera:inter_token_latency_seconds", "priority"), "priority {{priority}}")], "s"),
    ("Gateway TTFT and latency p95 by tier", [
        (_quantile("tessera_gateway_time_to_first_token_seconds", "tier"), "TTFT {{tier}}"),
        (_quantile("tessera_gateway_request_duration_seconds", "tier"), "e2e {{tier}}")], "s"),
    ("Throughput", [("sum by (model_name) (rate(tessera:generation_tokens_total[1m]))", "generated tok/s {{model_name}}"),
                    ("sum by (tier) (rate(tessera_gateway_requests_total[1m]))", "requests/s {{tier}}")], "short"),
    ("Concurrency and queue", [("sum by (instance) (tessera:num_requests_running)", "running {{instance}}"),
                               ("sum by (instance) (tessera:num_requests_waiting)", "waiting {{instance}}"),
                               ("tessera_gateway_worker_outstanding", "gateway in flight {{worker}}")], "short"),
    ("Prefix-cache hit rate", [("sum(rate(tessera:prefix_cache_hits_total[5m])) / sum(rate(tessera:prefix_cache_queries_total[5m]))",
                                "hit rate")], "percentunit"),
    ("KV-cache occupancy", [("tessera:kv_cache_usage_perc", "{{instance}}")], "percentunit"),
    ("Preemptions", [("sum by (instance) (rate(tessera:num_preemptions_total[5m]))", "{{instance}}")], "short"),
    ("Error rate (5xx) by tier", [('sum by (tier) (rate(tessera_gateway_requests_total{code=~"5.."}[5m])) / '
                                   "sum by (tier) (rate(tessera_gateway_requests_total[5m]))", "{{tier}}")], "percentunit"),
    ("Shedding and rate limits", [("sum by (tier, reason) (rate(tessera_gateway_rejections_total[5m]))", "gateway {{tier}} {{reason}}"),
                                  ("sum by (reason) (rate(tessera:request_rejected_total[5m]))", "worker {{reason}}")], "short"),
    ("SLO attainment by tier (1 h)", [('tessera_slo_attainment{window="1h"}', "{{tier}} {{sli}}")], "percentunit"),
    ("Error-budget burn rate by tier (1 h)", [('tessera_slo_burn_rate{window="1h"}', "{{tier}} {{sli}}")], "short"),
    ("Error budget remaining (30 d)", [("tessera_slo_error_budget_remaining", "{{tier}} {{sli}}")], "percentunit"),
    ("Workers up", [("tessera_gateway_worker_up", "{{worker}}")], "short"),
    ("Structured-output requests by kind", [("sum by (kind) (rate(tessera:structured_output_requests_total[5m]))",
                                             "{{kind}}")], "reqps"),
]


def dashboard() -> dict:
    panels = [_panel(i + 1, title, exprs, unit, 12 * (i % 2), 8 * (i // 2)) for i, (title, exprs, unit) in enumerate(PANELS)]
    return {
        "title": "Tessera: serving and SLOs", "uid": "tessera-slo", "schemaVersion": 39, "version": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "tags": ["tessera"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": panels,
    }


class _BlockDumper(yaml.SafeDumper):
    pass


_BlockDumper.add_representer(
    str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None)
)


def render_rules() -> str:
    header = "# Generated by `python -m controlplane.slo.deploy_files` from controlplane/slo/sli.py. Do not edit.\n"
    return header + yaml.dump(alert_rules(), Dumper=_BlockDumper, sort_keys=False, width=200)


def render_dashboard() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> None:
    RULES_PATH.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_PATH.parent.mkdir(parents=True, exist_ok=True)
    RULES_PATH.write_text(render_rules())
    DASHBOARD_PATH.write_text(render_dashboard())
    print(f"wrote {RULES_PATH} and {DASHBOARD_PATH}")


if __name__ == "__main__":
    main()
