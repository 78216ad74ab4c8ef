"""Admin for the cost of serving: the worker-class rate book (added through `worker_rate_create`,
never edited), and read-only spans and costs; the replica-hours list carries the month's charts."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import Count, Sum
from django.utils import timezone

from billing.costs.charts import month_charts
from billing.costs.months import month_range
from billing.errors import BillingError
from billing.models import ReplicaHourCost, ReplicaSpan, RequestCost, WorkerClassRate
from billing.readonly_admin import ReadOnlyAdmin
from billing.services import worker_rate_create
from billing.services.worker_rates import worker_rate_check, worker_rate_window_check


class WorkerClassRateForm(forms.ModelForm):
    class Meta:
        model = WorkerClassRate
        fields = ["worker_class", "currency", "hourly_cost", "prefill_tokens_per_second", "decode_tokens_per_second",
                  "effective_from", "effective_to", "note"]

    def clean(self):
        data = super().clean()
        if self.errors or self.instance.pk:  # an existing rate: every field is read-only, nothing to check
            return data
        try:
            checked = worker_rate_check(**data)
            worker_rate_window_check(worker_class=checked["worker_class"], effective_from=checked["effective_from"],
                                     effective_to=checked["effective_to"])
        except BillingError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(WorkerClassRate)
class WorkerClassRateAdmin(admin.ModelAdmin):
    """New rows only (through `worker_rate_create`: audited, closes the class's open rate)."""

    form = WorkerClassRateForm
    list_display = ["worker_class", "currency", "hourly_cost", "prefill_tokens_per_second", "decode_tokens_per_second",
                    "effective_from", "effective_to", "note"]
    list_filter = ["worker_class", "currency"]
    search_fields = ["worker_class", "note"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in WorkerClassRate._meta.fields] if obj is not None else []

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        if change:
            return
        obj.pk = worker_rate_create(**form.cleaned_data).pk  # the form ran the service's checks


@admin.register(ReplicaSpan)
class ReplicaSpanAdmin(ReadOnlyAdmin):
    list_display = ["deployment", "worker", "worker_class", "started_at", "last_seen_at"]
    list_filter = ["worker_class", "deployment"]
    date_hierarchy = "started_at"


@admin.register(ReplicaHourCost)
class ReplicaHourCostAdmin(ReadOnlyAdmin):
    change_list_template = "admin/billing/replicahourcost/change_list.html"
    list_display = ["hour", "deployment", "worker_class", "up_seconds", "busy_seconds", "requests", "total_cost",
                    "attributed_cost", "idle_cost", "currency", "unrated"]
    list_filter = ["unrated", "worker_class", "deployment", "currency"]
    date_hierarchy = "hour"
    show_full_result_count = False
    totals = {"replica_hours": Count("id"), "requests": Sum("requests"), "total_cost": Sum("total_cost"),
              "attributed_cost": Sum("attributed_cost"), "idle_cost": Sum("idle_cost")}

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context and "cl" in context:
            values = context["cl"].queryset.order_by().aggregate(**self.totals)
            context["billing_totals"] = [(name.replace("_", " "), values[name]) for name in self.totals]
            month = request.GET.get("hour__year") and request.GET.get("hour__month")
            label = (f"{int(request.GET['hour__year']):04d}-{int(request.GET['hour__month']):02d}" if month
                     and request.GET["hour__year"].isdigit() and request.GET["hour__month"].isdigit()
                     else f"{timezone.now():%Y-%m}")
            try:
                start, end = month_range(label)
            except ValueError:
                start, end = month_range(f"{timezone.now():%Y-%m}")
                label = f"{start:%Y-%m}"
            context["economics_month"] = label
            context["economics_charts"] = month_charts(start=start, end=end)
        return response


@admin.register(RequestCost)
class RequestCostAdmin(ReadOnlyAdmin):
    list_display = ["hour", "usage", "tenant", "model", "adapter", "tier", "kind", "deployment", "worker_class",
                    "cost", "currency"]
    list_filter = ["kind", "worker_class", "deployment", "tier", "currency"]
    date_hierarchy = "hour"
    list_select_related = ["usage", "tenant"]
    show_full_result_count = False
