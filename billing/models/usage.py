from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from billing.money import AMOUNT_MAX_DIGITS, AMOUNT_PLACES, METER_CACHED_INPUT, METER_INPUT, METER_OUTPUT


def _amount_field(verbose_name: str) -> models.DecimalField:
    return models.DecimalField(verbose_name, max_digits=AMOUNT_MAX_DIGITS, decimal_places=AMOUNT_PLACES, default=0)


class UsageRecord(models.Model):
    """One served request, written once from the gateway's `UsageEvent` (unique on `request_id`).

    Priced when written: `price` is the rate card entry in force at `created_at`, and the amounts are
    exact (16 decimal places, never rounded). `price` is null only when no price covered the request;
    such records bill nothing until `usage_records_reprice` finds them a price, and block finalizing.
    """

    class Status(models.TextChoices):
        OK = "ok"
        PARTIAL = "partial"
        ERROR = "error"

    request_id = models.CharField(max_length=128, unique=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage_records")
    api_key = models.ForeignKey(
        "tenants.APIKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_records"
    )
    api_key_prefix = models.CharField(max_length=64, blank=True, default="", help_text="Snapshot at write time.")
    model = models.CharField(max_length=200)
    adapter = models.CharField(max_length=200, blank=True, default="")
    tier = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices)
    prompt_tokens = models.PositiveIntegerField()
    cached_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()
    ttft_ms = models.FloatField(null=True, blank=True)  # latency metrics, not money: float is fine
    latency_ms = models.FloatField()
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)  # SLO availability (issue 9)
    itl_ms = models.FloatField(null=True, blank=True)  # mean inter-token latency of a stream (issue 9)
    # The batch (/v1/batches) a request was a line of: priced at the price's batch_percent, and a
    # column of the finance export so a batch's cost can be summed.
    batch_id = models.CharField(max_length=40, blank=True, default="")
    # A batch line's ledger identity (its batch and custom_id): unique, so that however often the line is
    # sent (a retry, a runner that died before storing the answer), the database keeps one row for it.
    batch_line = models.CharField(max_length=80, blank=True, default="")
    # A /v1/embeddings request: its input tokens are priced at the price's embeddings rate (own line).
    embeddings = models.BooleanField(default=False)
    # The worker that served it (its URL, as the gateway's journal names it): which replica's hour the
    # request's cost is a share of (billing/costs/). Blank on rows older than cost attribution.
    worker_url = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(help_text="When the request started; the price in force then applies.")
    ingested_at = models.DateTimeField(auto_now_add=True)
    price = models.ForeignKey("billing.Price", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    currency = models.CharField(max_length=3)
    input_amount = _amount_field("uncached input amount")
    cached_input_amount = _amount_field("cached input amount")
    output_amount = _amount_field("output amount")
    amount = _amount_field("amount")
    invoice = models.ForeignKey(
        "billing.Invoice", on_delete=models.PROTECT, null=True, blank=True, related_name="usage_records"
    )
    stripe_reported_at = models.DateTimeField(null=True, blank=True)
    stripe_report_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="billing_usage_tenant_time"),
            models.Index(fields=["created_at", "id"], name="billing_usage_time"),
            models.Index(
                fields=["id"], name="billing_usage_stripe_pending",
                condition=Q(stripe_reported_at__isnull=True, stripe_report_error=""),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(cached_tokens__lte=F("prompt_tokens")), name="billing_usage_cached_le_prompt"),
            models.UniqueConstraint(fields=["batch_line"], condition=~Q(batch_line=""),
                                    name="billing_usage_batch_line_unique"),
        ]

    def __str__(self) -> str:
        return self.request_id

    @property
    def uncached_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def meter_quantities(self) -> dict[str, int]:
        """Tokens per meter: what Stripe is told and what invoice lines count."""
        return {
            METER_INPUT: self.uncached_prompt_tokens,
            METER_CACHED_INPUT: self.cached_tokens,
            METER_OUTPUT: self.completion_tokens,
        }


class UsageDaily(models.Model):
    """Per (UTC day, tenant, API key, model, adapter, currency) roll-up, rebuilt from the ledger (never edited)."""

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey("tenants.APIKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    api_key_prefix = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=200)
    adapter = models.CharField(max_length=200, blank=True, default="")
    currency = models.CharField(max_length=3)
    requests = models.PositiveBigIntegerField()
    prompt_tokens = models.PositiveBigIntegerField()
    cached_tokens = models.PositiveBigIntegerField()
    completion_tokens = models.PositiveBigIntegerField()
    amount = _amount_field("amount")
    built_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "usage daily"
        ordering = ["-day", "tenant_id", "model"]
        indexes = [models.Index(fields=["tenant", "day"], name="billing_daily_tenant_day")]
        constraints = [
            # Two partial constraints because NULL api_key rows are distinct in a plain unique index.
            models.UniqueConstraint(
                fields=["day", "tenant", "api_key", "model", "adapter", "currency"],
                condition=Q(api_key__isnull=False), name="billing_daily_unique_with_key",
            ),
            models.UniqueConstraint(
                fields=["day", "tenant", "model", "adapter", "currency"],
                condition=Q(api_key__isnull=True), name="billing_daily_unique_without_key",
            ),
        ]
