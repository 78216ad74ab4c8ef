from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dataplane.worker.metrics import WorkerMetrics


def test_loop_histogram_buckets_are_cumulative_and_inclusive():
    m = WorkerMetrics("m", lambda: None)
    child = m.itl.labels("m", "0")
    for v in (0.01, 0.011, 0.5, 100.0):  # on a bound, just above it, mid-range, beyond the last
        child.observe(v)
    family = next(f for f in text_string_to_metric_families(m.render().decode())
                  if f.name == "tessera:inter_token_latency_seconds")
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("tessera:inter_token_latency_seconds_bucket", "0.01")] == 1
    assert samples[("tessera:inter_token_latency_seconds_bucket", "0.025")] == 2
    assert samples[("tessera:inter_token_latency_seconds_bucket", "0.5")] == 3
    assert samples[("tessera:inter_token_latency_seconds_bucket", "80.0")] == 3
    assert samples[("tessera:inter_token_latency_seconds_bucket", "+Inf")] == 4
    assert samples[("tessera:inter_token_latency_seconds_count", None)] == 4
    assert abs(samples[("tessera:inter_token_latency_seconds_sum", None)] - 100.521) < 1e-9


def test_priority_label_values_are_bounded():
    m = WorkerMetrics("m", lambda: None)
    assert m.trace(3, 0.0).priority == "3"
    assert m.trace(10**6, 0.0).priority == "other"
