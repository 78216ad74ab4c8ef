from __future__ import annotations

from django.db import models
from django.db.models import Q

from billing.money import (
    AMOUNT_MAX_DIGITS,
    AMOUNT_PLACES,
    MONEY_MAX_DIGITS,
    MONEY_PLACES,
    PRICE_MAX_DIGITS,
    PRICE_PLACES,
)


class Invoice(models.Model):
    """One tenant's bill for one calendar month (UTC) in one currency.

    draft → finalized (immutable) → paid, or → void. `total` is always the sum of the lines; a
    finalized invoice never changes again (a correction is a void plus a new invoice, or a credit
    line on the next one).
    """

    class Status(models.TextChoices):
        DRAFT = "draft"
        FINALIZED = "finalized"
        PAID = "paid"
        VOID = "void"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="invoices")
    period_start = models.DateField(help_text="First day of the month.")
    period_end = models.DateField(help_text="First day of the next month (exclusive).")
    currency = models.CharField(max_length=3, default="usd")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    number = models.CharField(max_length=64, unique=True, null=True, blank=True)
    rounding = models.CharField(max_length=32, help_text="Rounding rule applied to each line.")
    total = models.DecimalField(max_digits=MONEY_MAX_DIGITS, decimal_places=MONEY_PLACES, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    void_reason = models.CharField(max_length=200, blank=True, default="")
    stripe_invoice_id = models.CharField(max_length=255, blank=True, default="")
    stripe_status = models.CharField(max_length=32, blank=True, default="")
    stripe_synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-period_start", "tenant_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period_start", "currency"],
                condition=~Q(status="void"), name="billing_invoice_one_live_per_month",
            ),
            models.CheckConstraint(condition=Q(period_end__gt=models.F("period_start")), name="billing_invoice_period"),
        ]

    def __str__(self) -> str:
        return self.number or f"draft {self.tenant_id} {self.period_start:%Y-%m}"

    @property
    def is_mutable(self) -> bool:
        return self.status == self.Status.DRAFT


class InvoiceLine(models.Model):
    """One line: usage of one meter at one price (quantity × unit price, rounded once), or a credit / adjustment."""

    class Kind(models.TextChoices):
        USAGE = "usage"
        CREDIT = "credit"
        ADJUSTMENT = "adjustment"

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    description = models.CharField(max_length=300)
    price = models.ForeignKey("billing.Price", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    model = models.CharField(max_length=200, blank=True, default="")
    adapter = models.CharField(max_length=200, blank=True, default="")
    meter = models.CharField(max_length=16, blank=True, default="")
    quantity = models.PositiveBigIntegerField(default=0, help_text="Tokens (usage lines).")
    unit_price = models.DecimalField(
        "unit price per 1M tokens", max_digits=PRICE_MAX_DIGITS, decimal_places=PRICE_PLACES, null=True, blank=True
    )
    exact_amount = models.DecimalField(max_digits=AMOUNT_MAX_DIGITS, decimal_places=AMOUNT_PLACES)
    amount = models.DecimalField(max_digits=MONEY_MAX_DIGITS, decimal_places=MONEY_PLACES)
    stripe_invoice_item_id = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["invoice_id", "kind", "model", "adapter", "meter", "id"]
        constraints = [
            models.CheckConstraint(condition=~Q(kind="credit") | Q(amount__lte=0), name="billing_line_credit_negative"),
        ]

    def __str__(self) -> str:
        return self.description
