"""Prometheus metrics of the usage spool and of serving from memory while the database is away.

`tessera_usage_spool_bytes`, `tessera_usage_spool_files` and `tessera_usage_spool_oldest_seconds`
describe the host's spool directory (every gateway process on it, dead ones' files included), read
at scrape time; the counters are this process's. deploy/prometheus/tessera-usage-rules.yml alerts
on a spool that is not drained and on one nearing its cap.
"""

from __future__ import annotations

from django.conf import settings
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from controlplane.gateway.usage.spool import directory_state
from controlplane.slo.metrics import REGISTRY, CachedCollector

SPOOLED = Counter("tessera_usage_spooled_records_total",
                  "Usage records (journal rows, usage events, failed settlements) written to the local spool "
                  "because the database did not answer", registry=REGISTRY)
SPOOL_REFUSED = Counter("tessera_usage_spool_refused_total",
                        "Spool writes refused (full, or the disk failed): their requests were refused with 503",
                        registry=REGISTRY)
SERVED_FROM_MEMORY = Counter("tessera_gateway_served_from_memory_total",
                             "Requests that used memory instead of the unreachable database, by what "
                             "(keys: the last known key lookup; usage: spooled usage)", ["what"], registry=REGISTRY)


class SpoolCollector(CachedCollector):
    @staticmethod
    def _families() -> list[Metric]:
        state = directory_state(settings.TESSERA_USAGE_SPOOL_DIR)
        size = GaugeMetricFamily("tessera_usage_spool_bytes", "Bytes of usage waiting in this host's spool "
                                 "for the database (0: nothing owed)")
        size.add_metric([], state["bytes"])
        cap = GaugeMetricFamily("tessera_usage_spool_max_bytes", "The cap of one process's spool file")
        cap.add_metric([], float(settings.TESSERA_USAGE_SPOOL_MAX_BYTES))
        files = GaugeMetricFamily("tessera_usage_spool_files", "Spool files holding usage not yet replayed")
        files.add_metric([], state["files"])
        oldest = GaugeMetricFamily("tessera_usage_spool_oldest_seconds",
                                   "Age of the oldest spooled usage record not yet replayed (0: none)")
        oldest.add_metric([], state["oldest_seconds"])
        return [size, cap, files, oldest]


SPOOL_COLLECTOR = SpoolCollector()
REGISTRY.register(SPOOL_COLLECTOR)  # imported by controlplane.slo.metrics: every process reports its host's spool
