"""Operators' admin: tiers, tenants and keys. Writes with side effects go through services."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction
from django.utils.html import format_html

from controlplane.audit.admin_mixins import AuditedAdminMixin

from . import admin_panels, auth, services
from .models import APIKey, Tenant, Tier


@admin.register(Tier)
class TierAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = (
        "name", "priority", "requests_per_minute", "tokens_per_minute", "max_concurrent_requests",
        "monthly_token_budget", "monthly_spend_budget", "budget_enforcement", "slo_ttft_p95_ms", "slo_itl_p95_ms",
        "slo_availability_pct",
        "tenant_count",
    )
    list_filter = ("budget_enforcement",)
    search_fields = ("name", "description")
    ordering = ("priority", "name")

    @admin.display(description="tenants")
    def tenant_count(self, tier: Tier) -> int:
        return tier.tenants.count()

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        transaction.on_commit(auth.cache_clear)  # gateways in this process see the change at once


@admin.register(Tenant)
class TenantAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("slug", "name", "status_badge", "tier", "key_count", "created_at")
    list_filter = ("status", "tier")
    search_fields = ("slug", "name")
    list_select_related = ("tier",)
    readonly_fields = ("status", "created_at", "updated_at")
    prepopulated_fields = {"slug": ("name",)}
    actions = ("suspend", "activate")
    # The keys show in the read-only panels (admin/tenants/tenant/change_form.html), finance included.
    fieldsets = (
        (None, {"fields": ("name", "slug", "status", "tier")}),
        (
            "Overrides (blank = inherit from the tier)",
            {
                "fields": (
                    "priority_override", "requests_per_minute_override", "tokens_per_minute_override",
                    "max_concurrent_requests_override", "monthly_token_budget_override",
                    "monthly_spend_budget_override", "budget_enforcement_override",
                )
            },
        ),
        ("Observability", {"fields": ("log_content_sample_rate",)}),
        ("History", {"fields": ("created_at", "updated_at")}),
    )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        tenant = self.get_object(request, object_id)
        if tenant is not None and self.has_view_or_change_permission(request, tenant):
            extra_context = {**(extra_context or {}), "panels": admin_panels.tenant_panels(tenant),
                             "can_view_keys": request.user.has_perm("tenants.view_apikey")}
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="status", ordering="status")
    def status_badge(self, tenant: Tenant) -> str:
        colour = "#2e7d32" if tenant.is_active else "#c62828"
        return format_html('<b style="color:{}">{}</b>', colour, tenant.get_status_display())

    @admin.display(description="keys")
    def key_count(self, tenant: Tenant) -> int:
        return tenant.api_keys.filter(revoked=False).count()

    @admin.action(description="Suspend selected tenants", permissions=["change"])  # not for view-only finance
    def suspend(self, request, queryset):
        for tenant in queryset:
            services.tenant_suspend(tenant=tenant)
        self.message_user(request, f"Suspended {queryset.count()} tenant(s).")

    @admin.action(description="Re-activate selected tenants", permissions=["change"])
    def activate(self, request, queryset):
        for tenant in queryset:
            services.tenant_activate(tenant=tenant)
        self.message_user(request, f"Activated {queryset.count()} tenant(s).")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        transaction.on_commit(auth.cache_clear)


@admin.register(APIKey)
class APIKeyAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("prefix", "name", "tenant", "can_manage", "scopes", "expires_at", "revoked", "last_used_at", "created_at")
    list_filter = ("revoked", "can_manage", "tenant__tier", "tenant__status")
    search_fields = ("prefix", "name", "tenant__slug", "tenant__name")
    list_select_related = ("tenant",)
    autocomplete_fields = ("tenant",)
    actions = ("revoke",)
    date_hierarchy = "created_at"

    def get_fields(self, request, obj=None):
        editable = ["tenant", "name", "allowed_models", "allowed_adapters", "can_manage", "expires_at"]
        if obj is None:
            return editable
        return [*editable, "prefix", "revoked", "revoked_at", "rotated_from", "last_used_at", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("tenant", "prefix", "revoked", "revoked_at", "rotated_from", "last_used_at", "created_at")

    @admin.display(description="scopes")
    def scopes(self, key: APIKey) -> str:
        models = ", ".join(key.allowed_models) or "any model"
        adapters = ", ".join(key.allowed_adapters) or "any adapter"
        return f"{models}; {adapters}"

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request, queryset):
        for key in queryset.select_related("tenant"):
            services.api_key_revoke(tenant=key.tenant, key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")

    def save_model(self, request, obj, form, change):
        if change:
            # Every editable field goes through the service, can_manage included (it used to be dropped here).
            services.api_key_update(
                tenant=obj.tenant, key=obj, name=obj.name, allowed_models=obj.allowed_models or [],
                allowed_adapters=obj.allowed_adapters or [], expires_at=obj.expires_at, can_manage=obj.can_manage,
            )
            return
        created = services.api_key_create(
            tenant=obj.tenant, name=obj.name, allowed_models=obj.allowed_models or [],
            allowed_adapters=obj.allowed_adapters or [], expires_at=obj.expires_at, can_manage=obj.can_manage,
        )
        obj.__dict__.update({k: v for k, v in created.key.__dict__.items() if not k.startswith("_")})
        obj._state.adding = False
        messages.warning(
            request, f"New API key for {obj.tenant.slug}: {created.secret} — copy it now, it will not be shown again."
        )
