"""Prometheus gauges of the reconciler, read at scrape time (`GET /metrics`) from its own clock (ReconcilerState).

`tessera_reconciler_last_pass_age_seconds`: seconds since the reconciler last completed a pass. Beat asks
for one every TESSERA_RECONCILE_SECONDS (5 s), so more than a minute means the reconciler is not running:
the broker, beat, the Celery workers or the database is away, and meanwhile new deployments and adapters
wait, dead workers are not replaced and failed loads are not retried. `tessera_reconciler_last_resume_timestamp_seconds`:
when it last came back after such a gap (docs/reliability.md). deploy/prometheus/tessera-deploy-rules.yml
alerts on the first. One primary-key read per scrape; a scrape the database cannot serve shows neither.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.slo.metrics import REGISTRY

from .autoscale.metrics import AUTOSCALER_COLLECTOR
from .models import ReconcilerState

log = logging.getLogger("tessera.deployments")


class ReconcilerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        try:
            state = ReconcilerState.objects.filter(pk=1).first()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the database is away
            log.warning("reconciler metrics unavailable", exc_info=True)
            return
        if state is None or state.last_pass_at is None:
            return  # no pass yet: nothing to say (a fresh install)
        age = GaugeMetricFamily("tessera_reconciler_last_pass_age_seconds",
                                "Seconds since the deployments reconciler last completed a pass")
        age.add_metric([], max(0.0, (timezone.now() - state.last_pass_at).total_seconds()))
        yield age
        if state.resumed_at is not None:
            resumed = GaugeMetricFamily("tessera_reconciler_last_resume_timestamp_seconds",
                                        "When the reconciler last resumed after a gap in its passes (Unix time)")
            resumed.add_metric([], state.resumed_at.timestamp())
            yield resumed


RECONCILER_COLLECTOR = ReconcilerCollector()
_registered = False


def register() -> None:
    """Add the reconciler's and the autoscaler's series to the control plane's /metrics registry once per
    process."""
    global _registered
    if not _registered:
        REGISTRY.register(RECONCILER_COLLECTOR)
        REGISTRY.register(AUTOSCALER_COLLECTOR)
        _registered = True
