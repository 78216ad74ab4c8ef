"""Tenants, their tiers and their API keys.

A Tier is a named bundle of limits; a Tenant belongs to one tier and may override any limit.
An APIKey is stored only as a keyed hash (HMAC-SHA256 with a server secret) plus a short
visible prefix; the secret itself is shown once, at creation.
"""

from __future__ import annotations

import secrets

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class BudgetEnforcement(models.TextChoices):
    HARD = "hard", "Hard (refuse when exhausted)"
    SOFT = "soft", "Soft (serve and flag)"


class Tier(models.Model):
    name = models.SlugField(max_length=32, unique=True)
    description = models.CharField(max_length=200, blank=True)
    # Scheduler priority handed to workers as X-Priority: lower runs first.
    priority = models.PositiveSmallIntegerField(default=10)
    # Share of its priority level each tenant of this tier gets when tenants compete (X-Tenant-Weight;
    # dataplane/scheduler/fairness.py): weight 2 is served twice the tokens of weight 1 under load.
    fair_share_weight = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(1000)])
    # Every limit below: NULL means unlimited.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True)
    monthly_token_budget = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_spend_budget = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    budget_enforcement = models.CharField(
        max_length=8, choices=BudgetEnforcement.choices, default=BudgetEnforcement.HARD
    )
    slo_ttft_p95_ms = models.PositiveIntegerField(null=True, blank=True, verbose_name="SLO TTFT p95 (ms)")
    slo_itl_p95_ms = models.PositiveIntegerField(null=True, blank=True, verbose_name="SLO ITL p95 (ms)")
    # Fraction of requests over 30 days not failed by the platform, in percent (99.9 = three nines).
    slo_availability_pct = models.DecimalField(
        max_digits=6, decimal_places=3, null=True, blank=True, verbose_name="SLO availability (%)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority", "name"]
        constraints = [  # a weight of 0 would make workers refuse every request of the tier
            models.CheckConstraint(condition=models.Q(fair_share_weight__gte=1, fair_share_weight__lte=1000),
                                   name="tier_fair_share_weight_range"),
        ]

    def __str__(self) -> str:
        return self.name


class TenantStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    SUSPENDED = "suspended", "Suspended"


def new_cache_salt() -> str:
    return secrets.token_hex(16)


class Tenant(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=TenantStatus.choices, default=TenantStatus.ACTIVE)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="tenants")
    # Overrides: NULL/blank means "inherit from the tier".
    priority_override = models.PositiveSmallIntegerField(null=True, blank=True)
    requests_per_minute_override = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute_override = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_requests_override = models.PositiveIntegerField(null=True, blank=True)
    monthly_token_budget_override = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_spend_budget_override = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    budget_enforcement_override = models.CharField(
        max_length=8, choices=BudgetEnforcement.choices, blank=True, default=""
    )
    # Operator opt-in: the fraction of this tenant's requests whose prompt and completion text the
    # gateway logs (0 = never, the default; see docs/slo.md).
    log_content_sample_rate = models.FloatField(default=0.0)
    # Mixed into the workers' prefix-cache block hashes so tenants never share cached KV.
    cache_salt = models.CharField(max_length=64, default=new_cache_salt, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_active(self) -> bool:
        return self.status == TenantStatus.ACTIVE


class APIKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    # First characters of the secret ("sk-" + 8), enough for a human to tell keys apart.
    prefix = models.CharField(max_length=16, db_index=True)
    # HMAC-SHA256(TESSERA_API_KEY_SECRET, secret), hex. The only stored form of the secret.
    key_hash = models.CharField(max_length=64, unique=True)
    # Scopes. An empty list means "any".
    allowed_models = models.JSONField(default=list, blank=True)
    allowed_adapters = models.JSONField(default=list, blank=True)
    # May call the management API (/api/v1/) for its own tenant.
    can_manage = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Set on the new key when a key is rotated; the old key keeps working until its grace expiry.
    rotated_from = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="rotated_to"
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def is_usable(self, at=None) -> bool:
        at = at or timezone.now()
        return not self.revoked and (self.expires_at is None or self.expires_at > at)


# --- State of the database limiter (used when REDIS_URL is not set; see tenants/limits/database.py) ---


class RateLimitState(models.Model):
    """Two token buckets per tenant (requests/min, tokens/min); the row is also the tenant's lock."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="+")
    request_allowance = models.FloatField(default=0)
    token_allowance = models.FloatField(default=0)
    refilled_at = models.FloatField(default=0)  # epoch seconds of the last refill

    class Meta:
        verbose_name = "rate-limit state"


class Reservation(models.Model):
    """One row per admitted, unsettled request: counts toward concurrency; deleting it settles once."""

    request_id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    tokens = models.PositiveBigIntegerField()
    spend_nano = models.BigIntegerField(default=0)  # reserved spend in 1e-9 currency units
    period_start = models.DateField()
    expires_at = models.DateTimeField()  # after this a crashed request stops counting as concurrent

    class Meta:
        indexes = [models.Index(fields=["tenant", "expires_at"])]


class BudgetPeriod(models.Model):
    """Tokens and spend charged this calendar month (reservations included until settled)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    period_start = models.DateField()
    tokens = models.BigIntegerField(default=0)
    spend_nano = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period_start"], name="uniq_budget_period")
        ]


class AuthFailureWindow(models.Model):
    """Failed API-key authentications from one client address, as a token bucket (the database limiter's
    twin of the Redis key `<prefix>:af:<address>`); the row is also that address's lock."""

    address = models.CharField(max_length=64, primary_key=True)  # an IPv4 address or an IPv6 /64
    allowance = models.FloatField(default=0)  # failures this address may still make now
    refilled_at = models.FloatField(default=0, db_index=True)  # epoch seconds of the last refill

    class Meta:
        verbose_name = "failed-authentication window"
