"""What serving cost: an hourly rate per worker class, replicas' serving time, and that time's cost per
hour split between the requests served and idle (docs/economics.md).

Rates are a book like prices: rows are added, never edited, each one closing the open row of its
class. Spans and costs are derived data: `replica_spans_observe` samples the deployments' ready
replicas, `cost_hour_rebuild` recomputes one hour from spans, rates and the usage ledger.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from billing.money import AMOUNT_MAX_DIGITS, AMOUNT_PLACES, PRICE_MAX_DIGITS, PRICE_PLACES, ZERO

# Allocated costs are exact to the micro-unit: each replica-hour's cost is rounded to the cent once,
# then split into millionths by largest remainder, so every part sums back to it exactly.
COST_MAX_DIGITS, COST_PLACES = 24, 6
SECONDS_MAX_DIGITS, SECONDS_PLACES = 24, 6


def _cost_field(verbose_name: str) -> models.DecimalField:
    return models.DecimalField(verbose_name, max_digits=COST_MAX_DIGITS, decimal_places=COST_PLACES, default=0)


def _seconds_field(verbose_name: str) -> models.DecimalField:
    return models.DecimalField(verbose_name, max_digits=SECONDS_MAX_DIGITS, decimal_places=SECONDS_PLACES, default=0)


class WorkerClassRate(models.Model):
    """What one hour of a worker class costs, and how fast its engine works, over a time window.

    The class is a worker's `labels["worker_class"]`, else its accelerator (billing/costs/classes.py).
    The two speeds are the engine's step-cost model reduced to seconds per token at a full batch; they
    weight a request's prefill and decode tokens and say how much of an hour was busy.
    """

    worker_class = models.CharField(max_length=128)
    currency = models.CharField(max_length=3, default="usd")
    hourly_cost = models.DecimalField("cost per hour", max_digits=PRICE_MAX_DIGITS, decimal_places=PRICE_PLACES,
                                      validators=[MinValueValidator(ZERO)])
    prefill_tokens_per_second = models.DecimalField(
        max_digits=16, decimal_places=4, help_text="Prompt tokens a replica computes per second at a full batch.")
    decode_tokens_per_second = models.DecimalField(
        max_digits=16, decimal_places=4, help_text="Output tokens a replica generates per second at a full batch.")
    effective_from = models.DateTimeField(help_text="On the hour (UTC): an hour is costed at one rate.")
    effective_to = models.DateTimeField(null=True, blank=True, help_text="Exclusive, on the hour; blank: open-ended.")
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["worker_class", "-effective_from"]
        constraints = [
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True) | Q(effective_to__gt=models.F("effective_from")),
                name="billing_worker_rate_window_positive"),
            models.CheckConstraint(
                condition=Q(hourly_cost__gte=0) & Q(prefill_tokens_per_second__gt=0) & Q(decode_tokens_per_second__gt=0),
                name="billing_worker_rate_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.worker_class} {self.hourly_cost} {self.currency}/h from {self.effective_from:%Y-%m-%d %H:%M}"


class ReplicaSpan(models.Model):
    """One replica's time serving (ready) on one worker: from its `ready_at` to the last time it was seen
    ready. Copies names, not foreign keys: replicas and workers are deleted, their cost is not."""

    replica_uid = models.UUIDField()
    started_at = models.DateTimeField()  # the replica's ready_at
    last_seen_at = models.DateTimeField()  # the last observation that found it ready
    deployment = models.CharField(max_length=128)
    model = models.CharField(max_length=200)
    worker = models.CharField(max_length=128)
    worker_url = models.CharField(max_length=500)  # what usage records name (UsageRecord.worker_url)
    worker_class = models.CharField(max_length=128)

    class Meta:
        ordering = ["-started_at"]
        constraints = [models.UniqueConstraint(fields=["replica_uid", "started_at"], name="billing_span_unique")]
        indexes = [models.Index(fields=["worker_url", "started_at"], name="billing_span_url_start"),
                   models.Index(fields=["last_seen_at"], name="billing_span_last_seen")]

    def __str__(self) -> str:
        return f"{self.deployment}@{self.worker} from {self.started_at:%Y-%m-%d %H:%M}"


class ReplicaHourCost(models.Model):
    """One replica's cost over one UTC hour: `total_cost` = up hours x rate, rounded to the cent once;
    `attributed_cost` (the requests' RequestCost rows) + `idle_cost` = `total_cost`, exactly."""

    span = models.ForeignKey(ReplicaSpan, on_delete=models.CASCADE, related_name="hours")
    hour = models.DateTimeField()
    deployment = models.CharField(max_length=128)
    worker_class = models.CharField(max_length=128)
    rate = models.ForeignKey(WorkerClassRate, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    unrated = models.BooleanField(default=False, help_text="No rate for the class: costed at zero.")
    currency = models.CharField(max_length=3)
    up_seconds = _seconds_field("seconds up")
    busy_seconds = _seconds_field("seconds busy")  # requests' work, at most up_seconds
    work_seconds = _seconds_field("seconds of work")  # requests' work as the rate's speeds price it (may exceed up)
    requests = models.PositiveIntegerField(default=0)
    total_cost = _cost_field("cost")
    attributed_cost = _cost_field("attributed cost")
    idle_cost = _cost_field("idle cost")
    built_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-hour", "deployment"]
        constraints = [models.UniqueConstraint(fields=["span", "hour"], name="billing_replica_hour_unique")]
        indexes = [models.Index(fields=["hour"], name="billing_replica_hour_hour")]

    def __str__(self) -> str:
        return f"{self.deployment}/{self.worker_class} {self.hour:%Y-%m-%d %H:00}"


class RequestCost(models.Model):
    """A served request's share of its replica-hour: beside its ledger row, one per usage record."""

    usage = models.OneToOneField("billing.UsageRecord", on_delete=models.CASCADE, related_name="cost")
    replica_hour = models.ForeignKey(ReplicaHourCost, on_delete=models.CASCADE, related_name="request_costs")
    hour = models.DateTimeField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    model = models.CharField(max_length=200)
    adapter = models.CharField(max_length=200, blank=True, default="")
    tier = models.CharField(max_length=64, blank=True, default="")
    kind = models.CharField(max_length=24)  # online, batch, embeddings, batch-embeddings (billing/costs/attribute.py)
    deployment = models.CharField(max_length=128)
    worker_class = models.CharField(max_length=128)
    currency = models.CharField(max_length=3)
    prefill_seconds = _seconds_field("prefill seconds")
    decode_seconds = _seconds_field("decode seconds")
    cost = _cost_field("cost")
    # The cost split by the two kinds of work, for $/M input and output tokens (exact: sums to cost).
    input_cost = models.DecimalField(max_digits=AMOUNT_MAX_DIGITS, decimal_places=AMOUNT_PLACES, default=0)
    output_cost = models.DecimalField(max_digits=AMOUNT_MAX_DIGITS, decimal_places=AMOUNT_PLACES, default=0)

    class Meta:
        ordering = ["-hour", "id"]
        indexes = [models.Index(fields=["hour"], name="billing_request_cost_hour")]

    def __str__(self) -> str:
        return f"cost of usage {self.usage_id}"
