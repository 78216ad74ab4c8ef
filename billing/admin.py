"""Django admin for billing. The finance group holds only view permissions, so every page here is
read-only for it; the ledger itself (usage, roll-ups, Stripe events) is read-only for everyone.
Lists show totals over all rows matching the current filters."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Sum

from billing import cost_admin, services  # noqa: F401  (cost_admin registers the cost of serving's pages)
from billing.errors import BillingError
from billing.models import Invoice, InvoiceLine, Price, StripeCustomer, StripeEvent, UsageDaily, UsageRecord
from billing.readonly_admin import ReadOnlyAdmin
from billing.services.prices import price_window_check


class TotalsMixin:
    """Adds a totals table (aggregates over the whole filtered queryset, not just the page)."""

    change_list_template = "admin/billing/change_list_totals.html"
    totals: dict = {}

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context and "cl" in context and self.totals:
            values = context["cl"].queryset.order_by().aggregate(**self.totals)
            context["billing_totals"] = [(name.replace("_", " "), values[name]) for name in self.totals]
        return response


class PriceForm(forms.ModelForm):
    # Left blank: the default share (Price.batch_percent's default, half the online rates).
    batch_percent = forms.DecimalField(required=False, min_value=0, max_value=100, max_digits=5, decimal_places=2,
                                       label="Batch price (% of these rates)")

    class Meta:
        model = Price
        fields = ["model", "adapter", "tier", "currency", "input_per_mtok", "cached_input_per_mtok", "output_per_mtok",
                  "batch_percent", "embedding_input_per_mtok", "effective_from", "effective_to", "note"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            price_window_check(
                model=data["model"], adapter=data.get("adapter", ""), tier=data.get("tier", ""),
                effective_from=data["effective_from"], effective_to=data.get("effective_to"),
            )
        except BillingError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """New rows only (through `price_create`, which closes the previous open price); rows are never edited."""

    form = PriceForm
    list_display = ["model", "adapter", "tier", "currency", "input_per_mtok", "cached_input_per_mtok",
                    "output_per_mtok", "batch_percent", "embedding_input_per_mtok", "effective_from", "effective_to",
                    "note"]
    list_filter = ["model", "tier", "currency"]
    search_fields = ["model", "adapter", "note"]
    date_hierarchy = "effective_from"

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Price._meta.fields] if obj is not None else []

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        if change:
            return
        created = services.price_create(**form.cleaned_data)
        obj.pk = created.pk


@admin.register(UsageRecord)
class UsageRecordAdmin(TotalsMixin, ReadOnlyAdmin):
    list_display = ["request_id", "created_at", "tenant", "api_key_prefix", "model", "adapter", "tier", "status",
                    "prompt_tokens", "cached_tokens", "completion_tokens", "amount", "invoice", "batch_id"]
    list_filter = ["status", "model", "tier", "currency", ("price", admin.EmptyFieldListFilter), "tenant"]
    search_fields = ["request_id", "api_key_prefix", "tenant__slug", "batch_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "invoice"]
    show_full_result_count = False  # a count(*) over the ledger on every page is not free
    totals = {
        "requests": Count("id"), "prompt_tokens": Sum("prompt_tokens"), "cached_tokens": Sum("cached_tokens"),
        "completion_tokens": Sum("completion_tokens"), "amount": Sum("amount"),
    }


@admin.register(UsageDaily)
class UsageDailyAdmin(TotalsMixin, ReadOnlyAdmin):
    list_display = ["day", "tenant", "api_key_prefix", "model", "adapter", "requests", "prompt_tokens",
                    "cached_tokens", "completion_tokens", "amount", "currency"]
    list_filter = ["model", "currency", "tenant"]
    date_hierarchy = "day"
    list_select_related = ["tenant"]
    totals = {
        "requests": Sum("requests"), "prompt_tokens": Sum("prompt_tokens"), "cached_tokens": Sum("cached_tokens"),
        "completion_tokens": Sum("completion_tokens"), "amount": Sum("amount"),
    }


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    fields = ["kind", "description", "meter", "quantity", "unit_price", "exact_amount", "amount"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(TotalsMixin, admin.ModelAdmin):
    """Invoices change only through their actions (build, finalize, void), never by editing fields."""

    list_display = ["__str__", "tenant", "period_start", "currency", "status", "total", "stripe_status"]
    list_filter = ["status", "currency", "period_start", "stripe_status", "tenant"]
    search_fields = ["number", "tenant__slug", "stripe_invoice_id"]
    date_hierarchy = "period_start"
    inlines = [InvoiceLineInline]
    actions = ["rebuild_drafts", "finalize", "void"]
    totals = {"invoices": Count("id"), "total": Sum("total")}

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Invoice._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _run(self, request, queryset, action, verb: str) -> None:
        done = 0
        for invoice in queryset:
            try:
                action(invoice)
                done += 1
            except BillingError as exc:
                self.message_user(request, f"{invoice}: {exc}", messages.ERROR)
        self.message_user(request, f"{verb} {done} invoice(s).")

    @admin.action(description="Rebuild selected drafts from the ledger", permissions=["change"])
    def rebuild_drafts(self, request, queryset):
        self._run(request, queryset, lambda i: services.invoice_draft_build(
            tenant=i.tenant_id, month=i.period_start, currency=i.currency), "Rebuilt")

    @admin.action(description="Finalize selected drafts", permissions=["change"])
    def finalize(self, request, queryset):
        self._run(request, queryset, lambda i: services.invoice_finalize(invoice=i), "Finalized")

    @admin.action(description="Void selected invoices", permissions=["change"])
    def void(self, request, queryset):
        self._run(request, queryset, lambda i: services.invoice_void(invoice=i, reason=f"voided by {request.user}"), "Voided")


@admin.register(StripeCustomer)
class StripeCustomerAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "stripe_customer_id", "created_at"]
    search_fields = ["tenant__slug", "stripe_customer_id"]


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "outcome", "invoice", "received_at"]
    list_filter = ["type"]
    search_fields = ["event_id"]
