"""Prometheus gauges of the usage journal, read at scrape time (`GET /metrics`).

`tessera_usage_journal_rows{state}`: `in_flight` (requests being served now), `orphaned` (left by
a dead gateway, older than the sweeper's minimum age: not yet billed) and `unsettled` (billed, their
limiter settlement still owed); `tessera_usage_journal_oldest_orphan_seconds`: how long the oldest
orphan has waited. deploy/prometheus/tessera-usage-rules.yml alerts on both. One query, cached like
the SLO gauges, so several Prometheus servers scraping cost one.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db.models import Count, Min, Q
from prometheus_client.core import GaugeMetricFamily, Metric

from controlplane.gateway.models import InflightRequest
from controlplane.slo.metrics import CachedCollector


def journal_state(now: dt.datetime | None = None) -> dict[str, float]:
    now = now or dt.datetime.now(dt.UTC)
    cutoff = now - dt.timedelta(seconds=settings.TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS)
    unsettled = Q(unsettled_prompt_tokens__isnull=False)
    orphan = Q(admitted_at__lte=cutoff) & ~unsettled
    figures = InflightRequest.objects.aggregate(
        in_flight=Count("pk", filter=~unsettled & Q(admitted_at__gt=cutoff)),
        orphaned=Count("pk", filter=orphan), unsettled=Count("pk", filter=unsettled),
        oldest=Min("admitted_at", filter=orphan),
    )
    oldest = figures.pop("oldest")
    figures["oldest_orphan_seconds"] = (now - oldest).total_seconds() if oldest else 0.0
    return figures


class UsageJournalCollector(CachedCollector):
    @staticmethod
    def _families() -> list[Metric]:
        state = journal_state()
        rows = GaugeMetricFamily("tessera_usage_journal_rows", "Usage-journal rows: in_flight (being served), "
                                 "orphaned (a dead gateway's, not yet billed), unsettled (limiter settlement owed)",
                                 labels=["state"])
        for name in ("in_flight", "orphaned", "unsettled"):
            rows.add_metric([name], float(state[name]))
        oldest = GaugeMetricFamily("tessera_usage_journal_oldest_orphan_seconds",
                                   "Age of the oldest request a dead gateway left unbilled (0: none)")
        oldest.add_metric([], state["oldest_orphan_seconds"])
        return [rows, oldest]


JOURNAL_COLLECTOR = UsageJournalCollector()
