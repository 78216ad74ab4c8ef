"""Parse and format only; every write goes through tenants.services."""

from __future__ import annotations

from rest_framework import serializers

from tenants.models import APIKey, Tenant, Tier
from tenants.services import TENANT_OVERRIDE_FIELDS


class TierSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tier
        fields = [
            "id", "name", "description", "priority", "requests_per_minute", "tokens_per_minute",
            "max_concurrent_requests", "monthly_token_budget", "monthly_spend_budget", "budget_enforcement",
            "slo_ttft_p95_ms", "slo_itl_p95_ms", "slo_availability_pct", "created_at", "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]


class TierUpdateSerializer(TierSerializer):
    class Meta(TierSerializer.Meta):
        read_only_fields = ["id", "name", "created_at", "updated_at"]


class TenantSerializer(serializers.ModelSerializer):
    tier = serializers.SlugRelatedField(slug_field="name", queryset=Tier.objects.all())

    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "status", "tier", *TENANT_OVERRIDE_FIELDS, "created_at", "updated_at"]
        read_only_fields = ["id", "status", "created_at", "updated_at"]
        extra_kwargs = {"slug": {"required": False, "validators": []}}


class TenantUpdateSerializer(TenantSerializer):
    class Meta(TenantSerializer.Meta):
        read_only_fields = ["id", "slug", "status", "created_at", "updated_at"]


class APIKeySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = APIKey
        fields = [
            "id", "tenant", "name", "prefix", "allowed_models", "allowed_adapters", "can_manage", "expires_at",
            "revoked", "revoked_at", "rotated_from", "last_used_at", "created_at",
        ]
        read_only_fields = fields


class APIKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    allowed_models = serializers.ListField(child=serializers.CharField(max_length=200), required=False, default=list)
    allowed_adapters = serializers.ListField(child=serializers.CharField(max_length=200), required=False, default=list)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    can_manage = serializers.BooleanField(required=False, default=False)


class APIKeyUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    allowed_models = serializers.ListField(child=serializers.CharField(max_length=200), required=False)
    allowed_adapters = serializers.ListField(child=serializers.CharField(max_length=200), required=False)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class APIKeyRotateSerializer(serializers.Serializer):
    grace_seconds = serializers.IntegerField(min_value=0, max_value=30 * 86400, required=False, default=86400)


class CreatedAPIKeySerializer(APIKeySerializer):
    """The one response that carries the secret."""

    api_key = serializers.CharField(read_only=True, help_text="The secret. Shown once; store it now.")

    class Meta(APIKeySerializer.Meta):
        fields = [*APIKeySerializer.Meta.fields, "api_key"]
        read_only_fields = fields


class LimitsSerializer(serializers.Serializer):
    tier = serializers.CharField()
    priority = serializers.IntegerField()
    requests_per_minute = serializers.IntegerField(allow_null=True)
    tokens_per_minute = serializers.IntegerField(allow_null=True)
    max_concurrent_requests = serializers.IntegerField(allow_null=True)
    monthly_token_budget = serializers.IntegerField(allow_null=True)
    monthly_spend_budget = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    hard_budget = serializers.BooleanField()
    slo_ttft_p95_ms = serializers.IntegerField(allow_null=True)
    slo_itl_p95_ms = serializers.IntegerField(allow_null=True)


class UsageSerializer(serializers.Serializer):
    period_start = serializers.DateField()
    tokens = serializers.IntegerField(help_text="Tokens charged this month, in-flight reservations included.")
    spend = serializers.DecimalField(max_digits=20, decimal_places=9, help_text="Spend charged by the limiter this month.")
    billed_spend = serializers.DecimalField(
        max_digits=20, decimal_places=9, allow_null=True, help_text="Spend in billing's ledger (null if unavailable)."
    )
    monthly_token_budget = serializers.IntegerField(allow_null=True)
    monthly_spend_budget = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)


class TenantDetailSerializer(TenantSerializer):
    limits = LimitsSerializer(read_only=True)

    class Meta(TenantSerializer.Meta):
        fields = [*TenantSerializer.Meta.fields, "limits"]
