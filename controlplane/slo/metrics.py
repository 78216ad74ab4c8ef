"""The control plane's Prometheus metrics (`GET /metrics`).

Counted by the gateway as requests end (`observe_*`, a few dict lookups each), plus two collectors
that run at scrape time: worker health from the gateway's registry, and SLO attainment / burn-rate
gauges per tier from the request records (cached for `TESSERA_SLO_METRICS_CACHE_SECONDS`, so
several Prometheus servers scraping cost one query). Counters are per process: with several
gateway processes, scrape each (or sum in Prometheus), as for any multi-process server.

`tessera_gateway_sli_events_total{tier,sli,outcome}` is the Prometheus-native feed of the burn-rate
alerts (deploy/prometheus/): it classifies each request exactly as the SLO selectors do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.gateway.routing.workers import get_registry

from . import sli
from .selectors import slo_status

log = logging.getLogger("tessera.slo")

disable_created_metrics()  # no `*_created` series (as the workers)
REGISTRY = CollectorRegistry()
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

REQUESTS = Counter("tessera_gateway_requests", "Admitted requests by tier, model and HTTP status",
                   ["tier", "model", "code"], registry=REGISTRY)
REJECTIONS = Counter("tessera_gateway_rejections", "Requests refused before reaching a worker, by reason "
                     "(rate_limit_requests, rate_limit_tokens, concurrency, insufficient_quota, overloaded)",
                     ["tier", "reason"], registry=REGISTRY)
LATENCY = Histogram("tessera_gateway_request_duration_seconds", "Gateway arrival to last byte",
                    ["tier"], buckets=LATENCY_BUCKETS, registry=REGISTRY)
TTFT = Histogram("tessera_gateway_time_to_first_token_seconds", "Gateway arrival to first token",
                 ["tier"], buckets=LATENCY_BUCKETS, registry=REGISTRY)
SLI_EVENTS = Counter("tessera_gateway_sli_events", "Requests classified for each SLI (good or bad)",
                     ["tier", "sli", "outcome"], registry=REGISTRY)


def rejection_reason(code: str | None, kind: str | None) -> str:
    if code == "rate_limit_exceeded":
        return "rate_limit_tokens" if kind == "tokens" else ("rate_limit_requests" if kind == "requests" else "concurrency")
    return code or "unknown"


def observe_rejection(*, tier: str, reason: str) -> None:
    REJECTIONS.labels(tier, reason).inc()


def observe_request(
    *, tier: str, model: str, http_status: int | None, platform_failed: bool, latency_s: float,
    ttft_ms: float | None, itl_ms: float | None, ttft_target_ms: int | None, itl_target_ms: int | None,
) -> None:
    REQUESTS.labels(tier, model, str(http_status or 0)).inc()
    LATENCY.labels(tier).observe(latency_s)
    SLI_EVENTS.labels(tier, "availability", "bad" if platform_failed else "good").inc()
    if ttft_ms is not None:
        TTFT.labels(tier).observe(ttft_ms / 1000)
        if ttft_target_ms is not None:
            SLI_EVENTS.labels(tier, "ttft", "good" if ttft_ms <= ttft_target_ms else "bad").inc()
    if itl_ms is not None and itl_target_ms is not None:
        SLI_EVENTS.labels(tier, "itl", "good" if itl_ms <= itl_target_ms else "bad").inc()


class WorkerHealthCollector(Collector):
    """Per worker, as this gateway sees it: ready, requests in flight, engine queue from its last poll."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("tessera_gateway_worker_up", "1 when the worker answered /ready with 200", labels=["worker"])
        out = GaugeMetricFamily("tessera_gateway_worker_outstanding", "Requests this gateway has in flight there",
                                labels=["worker"])
        queue = GaugeMetricFamily("tessera_gateway_worker_waiting", "The worker's waiting queue at its last poll",
                                  labels=["worker"])
        for w in getattr(get_registry(), "workers", ()):
            up.add_metric([w.url], 1.0 if w.ready else 0.0)
            out.add_metric([w.url], float(getattr(w, "outstanding", 0)))
            queue.add_metric([w.url], float(getattr(w, "waiting", 0)))
        yield from (up, out, queue)


class CachedCollector(Collector):
    """Gauges computed at scrape time by `_families()`, cached for `TESSERA_SLO_METRICS_CACHE_SECONDS` so
    several Prometheus servers scraping cost one computation; a failure yields nothing (logged) rather
    than failing the scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None

    def collect(self) -> Iterator[Metric]:
        ttl = getattr(settings, "TESSERA_SLO_METRICS_CACHE_SECONDS", 15.0)
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > ttl:
                try:
                    self._cached = (time.monotonic(), self._families())
                except Exception:  # a scrape must not fail because the database hiccuped
                    log.exception("%s failed", type(self).__name__)
                    return iter(())
            return iter(self._cached[1])

    def clear(self) -> None:
        with self._lock:
            self._cached = None

    @staticmethod
    def _families() -> list[Metric]:
        raise NotImplementedError


class SLOCollector(CachedCollector):
    """Per-tier SLO gauges computed from the request records at scrape time, cached a few seconds."""

    @staticmethod
    def _families() -> list[Metric]:
        att = GaugeMetricFamily("tessera_slo_attainment", "Fraction of good requests per tier, SLI and window",
                                labels=["tier", "sli", "window"])
        burn = GaugeMetricFamily("tessera_slo_burn_rate", "Error-budget burn rate per tier, SLI and window "
                                 "(1 = spends the 30-day budget in 30 days)", labels=["tier", "sli", "window"])
        left = GaugeMetricFamily("tessera_slo_error_budget_remaining", "Share of the 30-day error budget left",
                                 labels=["tier", "sli"])
        objective = GaugeMetricFamily("tessera_slo_objective", "The SLO objective as a fraction of good requests",
                                      labels=["tier", "sli"])
        for status in slo_status(group_by=("tier",), percentiles=False):
            for name in sli.SLIS:
                goal = status.targets.objective(name)
                if goal is None:
                    continue
                objective.add_metric([status.tier, name], goal)
                if status.budget_remaining[name] is not None:
                    left.add_metric([status.tier, name], status.budget_remaining[name])
                for window in sli.WINDOWS:
                    view = status.windows[window][name]
                    if view["attainment"] is not None:
                        att.add_metric([status.tier, name, window], view["attainment"])
                    if view["burn_rate"] is not None:
                        burn.add_metric([status.tier, name, window], view["burn_rate"])
        return [att, burn, left, objective]


SLO_COLLECTOR = SLOCollector()
REGISTRY.register(WorkerHealthCollector())
REGISTRY.register(SLO_COLLECTOR)


# The gateway's usage journal and spool add their collectors to REGISTRY from GatewayConfig.ready,
# so this module never imports them back.


def render() -> bytes:
    return generate_latest(REGISTRY)
