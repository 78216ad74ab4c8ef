"""Prometheus metrics named after vLLM's (prefix `tessera:`), so its dashboards translate directly.

Latency histograms are observed by the worker per request, in the worker's clock: TTFT and
end-to-end from the moment the HTTP request was accepted, inter-token latency between the
deltas of one completion as they reach the HTTP layer (what a client sees, event-loop lag
included); queue time is the engine's (arrival to first schedule). Engine gauges and counters
are read from the engine's latest stats snapshot at scrape time, so the step loop pays nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from dataplane.stats import SchedulerStats

P = "tessera:"
MAX_PRIORITY_LABEL = 16
disable_created_metrics()  # no `*_created` series (as vLLM): they double the counters' output for nothing
# vLLM's buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


EMBEDDING_STATUSES = ("ok", "rejected", "error", "cancelled")


def priority_label(priority: int) -> str:
    """Bounded label values: a client may send any body priority (it can only lower its own)."""
    return str(priority) if -MAX_PRIORITY_LABEL <= priority <= MAX_PRIORITY_LABEL else "other"


class EngineCollector(Collector):
    """Gauges and cumulative counters from `SchedulerStats`, read when Prometheus scrapes."""

    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats | None]) -> None:
        self.model_name = model_name
        self.stats = stats

    def _families(self, s: SchedulerStats | None) -> Iterator[Metric]:
        labels = [self.model_name]
        t = s.kv_offload if s is not None else None
        gauges = (("num_requests_running", "Requests holding KV blocks (each of n completions counts)",
                   s and s.num_running),
                  ("num_requests_waiting", "Requests queued, preempted ones included", s and s.num_waiting),
                  ("num_requests_paused", "Background (batch) requests holding their blocks while online work runs",
                   s and s.num_paused),
                  ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use, 0 to 1", s and s.kv_cache_usage),
                  ("cuda_graph_count", "Decode CUDA graphs captured (0: eager)", s and s.cuda_graphs),
                  ("cuda_graph_capture_seconds", "Seconds the decode graphs' capture took at start-up",
                   s and s.cuda_graph_capture_seconds),
                  ("cuda_graph_memory_bytes", "Device memory of the decode graphs' pool", s and s.cuda_graph_memory_bytes),
                  ("kv_offload_blocks", "KV blocks held in the prefix cache's second tier", t.held_blocks if t else 0),
                  ("kv_offload_bytes", "Bytes the second tier holds", t.held_bytes if t else 0),
                  ("kv_offload_capacity_bytes", "The second tier's byte cap (0: no second tier)",
                   t.capacity_bytes if t else 0))
        for name, doc, value in gauges:
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            if s is not None:
                g.add_metric(labels, float(value))
            yield g
        counters = (("prompt_tokens", "Prompt tokens computed (prefix-cache hits excluded)", s and s.prompt_tokens),
                    ("generation_tokens", "Tokens generated", s and s.generation_tokens),
                    ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                     s and s.prefix_cache_queries),
                    ("prefix_cache_hits", "Prompt tokens found in the prefix cache", s and s.prefix_cache_hits),
                    ("num_preemptions", "Requests preempted (recomputed later)", s and s.num_preemptions),
                    ("spec_decode_num_drafts", "Verify steps that carried n-gram draft tokens", s and s.spec_num_drafts),
                    ("spec_decode_num_draft_tokens", "Draft tokens proposed (speculative decoding)",
                     s and s.spec_num_draft_tokens),
                    ("spec_decode_num_accepted_tokens", "Draft tokens the model agreed with",
                     s and s.spec_num_accepted_tokens),
                    ("cuda_graph_replays", "Decode steps replayed from a CUDA graph", s and s.cuda_graph_replays),
                    ("kv_offload_saved_blocks", "KV blocks evicted from the KV cache and kept in the second tier",
                     t.saved_blocks if t else 0),
                    ("kv_offload_saved_bytes", "Bytes written to the second tier", t.saved_bytes if t else 0),
                    ("kv_offload_loaded_blocks", "KV blocks loaded back from the second tier (hits)",
                     t.loaded_blocks if t else 0),
                    ("kv_offload_loaded_bytes", "Bytes read back from the second tier", t.loaded_bytes if t else 0),
                    ("kv_offload_load_seconds", "Seconds spent reading and verifying second-tier blocks",
                     t.load_seconds if t else 0),
                    ("kv_offload_failed_loads", "Second-tier entries missing or corrupt at load (recomputed)",
                     t.failed_loads if t else 0),
                    ("kv_offload_failed_saves", "Second-tier writes that failed (the block was not kept)",
                     t.failed_saves if t else 0))
        for name, doc, value in counters:
            c = CounterMetricFamily(P + name, doc, labels=["model_name"])
            if s is not None:
                c.add_metric(labels, float(value))
            yield c

    def describe(self) -> Iterator[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        return self._families(self.stats())


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus' `le`
        self.sum += value


class LoopHistogram(Collector):
    """A histogram observed and scraped on the event loop's thread only, so it needs no lock: about
    1 us an observation where prometheus_client's Histogram takes ~6 us (a lock, two value updates).
    ITL is observed once per streamed token, on the thread that also holds the GIL the engine needs."""

    def __init__(self, name: str, doc: str, labelnames: list[str], buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.labelnames, self.bounds = name, doc, labelnames, buckets
        self.children: dict[tuple[str, ...], _Buckets] = {}

    def labels(self, *values: str) -> _Buckets:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = _Buckets(self.bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for values, child in list(self.children.items()):
            cumulative, total = [], 0
            for le, n in zip(les, child.counts, strict=True):
                total += n
                cumulative.append((le, total))
            family.add_metric(list(values), cumulative, child.sum)
        yield family


class WorkerMetrics:
    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats | None],
                 registry: CollectorRegistry | None = None) -> None:
        self.model_name = model_name
        self.registry = registry or CollectorRegistry()
        r, lat = self.registry, ["model_name", "priority"]
        self.ttft = LoopHistogram(P + "time_to_first_token_seconds", "Request accepted to first token", lat,
                                  TTFT_BUCKETS)
        self.itl = LoopHistogram(P + "inter_token_latency_seconds", "Gap between tokens of one completion", lat,
                                 ITL_BUCKETS)
        self.e2e = LoopHistogram(P + "e2e_request_latency_seconds", "Request accepted to last token", lat,
                                 REQUEST_BUCKETS)
        self.queue = LoopHistogram(P + "request_queue_time_seconds", "Engine arrival to first schedule", lat,
                                   REQUEST_BUCKETS)
        for h in (self.ttft, self.itl, self.e2e, self.queue):
            r.register(h)
        self.success = Counter(P + "request_success", "Completions finished, by reason (one per choice)",
                               ["model_name", "priority", "finished_reason"], registry=r)
        self.rejected = Counter(P + "request_rejected", "Requests refused before reaching the engine",
                                ["model_name", "reason"], registry=r)
        # Structured outputs by constraint: json, json_object, regex, choice, grammar; tool calls count
        # as json (their grammar is a schema).
        self.structured = Counter(P + "structured_output_requests", "Requests whose output a grammar constrains",
                                  ["model_name", "kind"], registry=r)
        # Embeddings (/v1/embeddings) apart from generation: they finish with no token, so TTFT, ITL, e2e
        # and request_success never see them. An embedding is one prefill, hence the TTFT buckets.
        self.embedding_requests = Counter(
            P + "embedding_requests", "Embedding requests by outcome: ok; rejected (their checks or a full queue); "
            "error (the engine failed); cancelled (the client left)", ["model_name", "status"], registry=r)
        self.embedding_prompt_tokens = Counter(P + "embedding_prompt_tokens", "Input tokens of embedding requests "
                                               "answered (prefix-cache hits included)", ["model_name"], registry=r)
        self.embedding_duration = LoopHistogram(P + "embedding_request_duration_seconds",
                                                "Embedding request accepted to answer", lat, TTFT_BUCKETS)
        r.register(self.embedding_duration)
        for status in EMBEDDING_STATUSES:  # every series from the start: a rate() over 0 -> 1 is not missed
            self.embedding_requests.labels(model_name, status)
        self.embedding_prompt_tokens.labels(model_name)
        r.register(EngineCollector(model_name, stats))
        self._children: dict[str, tuple] = {}

    def trace(self, priority: int, started: float) -> RequestTrace:
        key = priority_label(priority)
        children = self._children.get(key)
        if children is None:
            labels = (self.model_name, key)
            children = self._children[key] = (self.ttft.labels(*labels), self.itl.labels(*labels),
                                              self.e2e.labels(*labels), self.queue.labels(*labels))
        return RequestTrace(self, key, children, started)

    def embedding(self, status: str, *, priority: int = 0, prompt_tokens: int = 0, seconds: float | None = None
                  ) -> None:
        """One embedding request's outcome; its tokens and duration when it was answered (`ok`)."""
        self.embedding_requests.labels(self.model_name, status).inc()
        if status == "ok":
            self.embedding_prompt_tokens.labels(self.model_name).inc(prompt_tokens)
            if seconds is not None:
                self.embedding_duration.labels(self.model_name, priority_label(priority)).observe(seconds)

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTrace:
    """One HTTP request's timings; `token()` per delta that carried tokens, `finish()` once."""

    __slots__ = ("metrics", "priority", "ttft", "itl", "e2e", "queue", "started", "first", "last", "done")

    def __init__(self, metrics: WorkerMetrics, priority: str, children: tuple, started: float) -> None:
        self.metrics, self.priority, self.started = metrics, priority, started
        self.ttft, self.itl, self.e2e, self.queue = children
        self.first: float | None = None
        self.last: dict[int, float] = {}  # per choice index
        self.done = False

    def token(self, index: int, now: float) -> None:
        last = self.last.get(index)
        if last is not None:
            self.itl.observe(now - last)
        elif self.first is None:
            self.first = now
            self.ttft.observe(now - self.started)
        self.last[index] = now

    def finish(self, reasons: list[str], queue_time: float | None, now: float) -> None:
        if self.done:
            return
        self.done = True
        if queue_time is not None:
            self.queue.observe(queue_time)
        if self.first is not None:
            self.e2e.observe(now - self.started)
        for reason in reasons:
            self.metrics.success.labels(self.metrics.model_name, self.priority, reason).inc()

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first is None else self.first - self.started
