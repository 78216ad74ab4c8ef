from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from billing.money import PRICE_MAX_DIGITS, PRICE_PLACES, ZERO


def _rate_field(verbose_name: str) -> models.DecimalField:
    return models.DecimalField(
        verbose_name, max_digits=PRICE_MAX_DIGITS, decimal_places=PRICE_PLACES, validators=[MinValueValidator(ZERO)]
    )


class Price(models.Model):
    """A rate card entry: what 1M tokens of one model (optionally one adapter / tier) cost over a time window.

    Blank `adapter` or `tier` means "any"; the lookup prefers the most specific entry in force
    (adapter match, then tier match, then the latest `effective_from`). Rows are never edited once
    usage refers to them: a price change is a new row that closes the previous one.
    """

    # The price of every model the price book does not name; any entry for the model itself wins over it.
    ANY_MODEL = "*"

    model = models.CharField(max_length=200, help_text="Base model name as served; * : any model not priced by name.")
    adapter = models.CharField(max_length=200, blank=True, default="", help_text="Blank: any adapter.")
    tier = models.CharField(max_length=64, blank=True, default="", help_text="Blank: any tier.")
    currency = models.CharField(max_length=3, default="usd")
    input_per_mtok = _rate_field("input per 1M tokens")
    cached_input_per_mtok = _rate_field("cached input per 1M tokens")
    output_per_mtok = _rate_field("output per 1M tokens")
    batch_percent = models.DecimalField(
        "batch price (% of the rates above)", max_digits=5, decimal_places=2, default=Decimal("50"),
        validators=[MinValueValidator(ZERO), MaxValueValidator(Decimal("100"))],
        help_text="Batch API (/v1/batches) usage is billed at this share of the online rates.")
    # Embeddings (/v1/embeddings) bill their input tokens, cached or not, at this rate; blank: the input rate.
    embedding_input_per_mtok = models.DecimalField(
        "embeddings input per 1M tokens", max_digits=PRICE_MAX_DIGITS, decimal_places=PRICE_PLACES, null=True,
        blank=True, validators=[MinValueValidator(ZERO)],
        help_text="/v1/embeddings input tokens (cached or not) at this rate; blank: the input rate.")
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField(null=True, blank=True, help_text="Exclusive; blank: open-ended.")
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "adapter", "tier", "-effective_from"]
        indexes = [models.Index(fields=["model", "effective_from"], name="billing_price_model_from")]
        constraints = [
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True) | Q(effective_to__gt=models.F("effective_from")),
                name="billing_price_window_positive",
            ),
            models.CheckConstraint(
                condition=Q(input_per_mtok__gte=0) & Q(cached_input_per_mtok__gte=0) & Q(output_per_mtok__gte=0),
                name="billing_price_rates_non_negative",
            ),
        ]

    def __str__(self) -> str:
        scope = "/".join(part for part in (self.model, self.adapter, self.tier) if part)
        return f"{scope} {self.currency} from {self.effective_from:%Y-%m-%d %H:%M}"

    def rate(self, field: str, *, batch: bool = False, embeddings: bool = False) -> Decimal:
        """A per-1M rate, at the batch share for a batch line (exact: a percentage of a decimal). An
        embeddings request's input (cached or not) is on its own line: `embedding_input_per_mtok`."""
        rate = getattr(self, field)
        if embeddings and field in ("input_per_mtok", "cached_input_per_mtok"):
            rate = self.input_per_mtok if self.embedding_input_per_mtok is None else self.embedding_input_per_mtok
        if not batch:
            return rate
        # Rounded to the price book's places, so the batch rate is a rate like any other and amounts
        # (tokens x rate) stay exact at AMOUNT_PLACES.
        return (rate * self.batch_percent / 100).quantize(Decimal(1).scaleb(-PRICE_PLACES))

    @property
    def specificity(self) -> tuple[int, int]:
        return (1 if self.adapter else 0, 1 if self.tier else 0)
