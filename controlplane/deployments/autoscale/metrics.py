"""`tessera:autoscaler_*` gauges and counters, read at scrape time from the database.

The autoscaler runs in the reconciler's Celery worker; Prometheus scrapes the web processes. So
nothing is counted in process memory: each scrape reads the deployments and their AutoscalerState
rows (one query, a row per deployment) and reports:

| series | labels | what |
|---|---|---|
| tessera:autoscaler_desired_replicas | deployment, accelerator, autoscaled | replicas wanted now (every deployment: the worker pool's size is their sum; deploy/k8s/autoscaling.yaml scales on it) |
| tessera:autoscaler_min_replicas / _max_replicas | deployment | the bounds (autoscaled deployments) |
| tessera:autoscaler_recommended_replicas | deployment | what the last decision asked for |
| tessera:autoscaler_signal | deployment, signal | the last reading: ready, reporting, running, waiting, waiting_per_replica, kv_usage_max, fast_burn, recent_requests |
| tessera:autoscaler_state | deployment, reason | 1 for the last decision's reason (steady, stabilising, down_cooldown, signals_missing, …) |
| tessera:autoscaler_decisions_total | deployment, direction | changes made: up, down, cold_start |

`accelerator` is the deployment's placement accelerator (blank: any), so a cluster with several GPU
pools sums each pool's own deployments.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..models import Deployment

log = logging.getLogger("tessera.deployments")

SIGNALS = ("ready", "reporting", "running", "waiting", "kv_usage_max", "fast_burn", "recent_requests")


class AutoscalerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        try:
            deployments = list(Deployment.objects.select_related("autoscaler").order_by("name"))
        except Exception:  # noqa: BLE001 - a scrape must not fail because the database is away
            log.warning("autoscaler metrics unavailable", exc_info=True)
            return
        desired = GaugeMetricFamily("tessera:autoscaler_desired_replicas", "Replicas a deployment wants now",
                                    labels=["deployment", "accelerator", "autoscaled"])
        low = GaugeMetricFamily("tessera:autoscaler_min_replicas", "Autoscaling floor", labels=["deployment"])
        high = GaugeMetricFamily("tessera:autoscaler_max_replicas", "Autoscaling ceiling", labels=["deployment"])
        recommended = GaugeMetricFamily("tessera:autoscaler_recommended_replicas",
                                        "What the autoscaler's last decision asked for", labels=["deployment"])
        signal = GaugeMetricFamily("tessera:autoscaler_signal", "The autoscaler's last reading of a signal",
                                   labels=["deployment", "signal"])
        state = GaugeMetricFamily("tessera:autoscaler_state", "1 for the reason of the last decision",
                                  labels=["deployment", "reason"])
        decisions = CounterMetricFamily("tessera:autoscaler_decisions", "Changes of desired replicas the "
                                        "autoscaler made", labels=["deployment", "direction"])
        for d in deployments:
            accelerator = str((d.placement or {}).get("accelerator") or "")
            desired.add_metric([d.name, accelerator, str(d.autoscaled).lower()], d.desired_replicas)
            if not d.autoscaled:
                continue
            low.add_metric([d.name], d.min_replicas)
            high.add_metric([d.name], d.max_replicas)
            s = getattr(d, "autoscaler", None)
            if s is None:
                continue
            recommended.add_metric([d.name], s.recommended)
            readings = dict(s.signals or {})
            if readings.get("reporting"):
                readings["waiting_per_replica"] = readings.get("waiting", 0) / readings["reporting"]
            for name in (*SIGNALS, "waiting_per_replica"):
                if isinstance(readings.get(name), int | float):
                    signal.add_metric([d.name, name], float(readings[name]))
            if s.reason:
                state.add_metric([d.name, s.reason], 1)
            for direction, count in (("up", s.ups), ("down", s.downs), ("cold_start", s.cold_starts)):
                decisions.add_metric([d.name, direction], count)
        yield from (desired, low, high, recommended, signal, state, decisions)


AUTOSCALER_COLLECTOR = AutoscalerCollector()  # registered with the reconciler's (deployments/metrics.py)
