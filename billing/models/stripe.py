from __future__ import annotations

from django.db import models


class StripeCustomer(models.Model):
    """The Stripe customer that stands for a tenant (one each)."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.PROTECT, related_name="stripe_customer")
    stripe_customer_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.stripe_customer_id


class StripeEvent(models.Model):
    """A webhook event already processed: its id is the replay guard (a second delivery is a no-op)."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    livemode = models.BooleanField(default=False)
    invoice = models.ForeignKey("billing.Invoice", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    outcome = models.CharField(max_length=200, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id}"
