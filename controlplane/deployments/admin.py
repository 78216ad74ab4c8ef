"""Operators' admin: models, adapters, workers, deployments and replicas. Writes go through services."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html

from common.errors import ApplicationError
from controlplane.audit.admin_mixins import AuditedAdminMixin

from . import adapter_store, admin_panels, reconciler, services
from .models import Adapter, AdapterPlacement, Deployment, Model, Replica, ReplicaStatus, Worker, WorkerStatus

STATUS_COLOURS = {"ready": "#2e7d32", "loading": "#1565c0", "starting": "#1565c0", "pending": "#6d6d6d",
                  "stopping": "#ef6c00", "draining": "#ef6c00", "failed": "#c62828", "dead": "#c62828",
                  "deleting": "#ef6c00"}


def badge(status: str):
    return format_html('<b style="color:{}">{}</b>', STATUS_COLOURS.get(status, "#000"), status)


def _may(request, codename: str) -> bool:
    """Each admin action names the permission it needs (`@admin.action(permissions=[...])`): Django
    shows and runs an action without one for anyone who may see the list, a read-only role included."""
    return request.user.has_perm(f"deployments.{codename}")


def _report(modeladmin, request, done: int, what: str, errors: list[str]) -> None:
    if done:
        modeladmin.message_user(request, f"{done} {what}.", messages.SUCCESS)
    for error in errors:
        modeladmin.message_user(request, error, messages.ERROR)


@admin.register(Model)
class ModelAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "source", "source_kind", "architecture", "context_length", "quantizations",
                    "deployment_count")
    list_filter = ("architecture",)
    search_fields = ("name", "source")

    @admin.display(description="deployments")
    def deployment_count(self, model: Model) -> int:
        return model.deployments.count()


class PlacementInline(admin.TabularInline):
    model = AdapterPlacement
    extra = 0
    can_delete = False
    fields = ("replica", "status", "reason", "error_kind", "attempt", "failures", "updated_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class AdapterForm(forms.ModelForm):
    """Adds go through services.adapter_create: the same store check and per-tenant cap as the API."""

    class Meta:
        model = Adapter
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if self.instance.pk is None and data.get("tenant") is not None and data.get("source"):
            try:
                data["source"] = adapter_store.adapter_source_normalize(tenant=data["tenant"], source=data["source"])
            except ApplicationError as exc:
                self.add_error("source", exc.message)
        return data


@admin.register(Adapter)
class AdapterAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = AdapterForm
    list_display = ("served_name", "tenant", "base_model", "rank", "status_badge", "updated_at")
    list_filter = ("status", "base_model", "tenant")
    search_fields = ("name", "served_name", "tenant__slug")
    list_select_related = ("tenant", "base_model")
    readonly_fields = ("served_name", "status", "reason", "reason_detail", "created_at", "updated_at")
    inlines = (PlacementInline,)
    actions = ("delete_through_service",)

    def get_readonly_fields(self, request, obj=None):
        # A registered adapter's tenant and source stay as checked (delete and register again to move it).
        return self.readonly_fields + (("tenant", "source") if obj is not None else ())

    @admin.display(description="status", ordering="status")
    def status_badge(self, adapter: Adapter):
        return badge(adapter.status)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        try:
            created = services.adapter_create(tenant=obj.tenant, name=obj.name, base_model=obj.base_model,
                                              source=obj.source, rank=obj.rank)
        except ApplicationError as exc:  # the cap, a duplicate name: said on the page, nothing saved
            self.message_user(request, exc.message, messages.ERROR)
            return
        obj.pk, obj.served_name, obj._state.adding = created.pk, created.served_name, False

    def response_add(self, request, obj, post_url_continue=None):
        if obj.pk is None:  # refused by the service
            return HttpResponseRedirect(request.path)
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Unload and delete the selected adapters", permissions=["delete"])
    def delete_through_service(self, request, queryset):
        for adapter in queryset:
            services.adapter_delete(adapter=adapter)
        _report(self, request, len(queryset), "adapter(s) being deleted", [])


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "url", "status_badge", "cordoned", "accelerator", "memory_gib", "loaded_model",
                    "num_running", "num_waiting", "kv_cache_usage", "heartbeat_age")
    list_filter = ("status", "cordoned", "accelerator")
    search_fields = ("name", "url")
    readonly_fields = [f.name for f in Worker._meta.fields]
    actions = ("drain", "uncordon", "mark_dead", "release")

    def has_add_permission(self, request) -> bool:
        return False  # workers register themselves

    def has_drain_permission(self, request) -> bool:
        return _may(request, "drain_worker")

    def has_mark_dead_permission(self, request) -> bool:
        return _may(request, "mark_dead_worker")

    def has_release_permission(self, request) -> bool:
        return _may(request, "release_worker")

    @admin.display(description="status", ordering="status")
    def status_badge(self, worker: Worker):
        return badge(worker.status)

    @admin.display(description="memory (GiB)")
    def memory_gib(self, worker: Worker) -> str:
        return f"{worker.memory_bytes / 2**30:.1f}" if worker.memory_bytes else "-"

    @admin.display(description="last heartbeat", ordering="last_heartbeat_at")
    def heartbeat_age(self, worker: Worker) -> str:
        if worker.last_heartbeat_at is None:
            return "never"
        return f"{(timezone.now() - worker.last_heartbeat_at).total_seconds():.0f} s ago"

    @admin.action(description="Drain: move replicas away, place nothing new", permissions=["drain"])
    def drain(self, request, queryset):
        for worker in queryset:
            services.worker_cordon(worker=worker, cordoned=True)
        _report(self, request, len(queryset), "worker(s) draining", [])

    @admin.action(description="Uncordon: take new replicas again", permissions=["drain"])
    def uncordon(self, request, queryset):
        for worker in queryset:
            services.worker_cordon(worker=worker, cordoned=False)
        _report(self, request, len(queryset), "worker(s) uncordoned", [])

    @admin.action(description="Mark dead now and reschedule its replicas", permissions=["mark_dead"])
    def mark_dead(self, request, queryset):
        for worker in queryset.exclude(status=WorkerStatus.DEAD):
            services.worker_mark_dead(worker=worker, reason=f"marked dead by {request.user}")
        _report(self, request, len(queryset), "worker(s) marked dead", [])

    @admin.action(description="Release the registration: another process may register under this name",
                  permissions=["release"])
    def release(self, request, queryset):
        for worker in queryset:
            services.worker_release(worker=worker, reason=f"registration released by {request.user}")
        _report(self, request, len(queryset), "worker registration(s) released", [])


class DeploymentForm(forms.ModelForm):
    class Meta:
        model = Deployment
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "min_replicas" in self.fields:
            self.fields["min_replicas"].required = False  # blank: 1, the model's default
        if "prefill_replicas" in self.fields:
            self.fields["prefill_replicas"].required = False  # blank: 0, none

    def clean(self):
        data = super().clean()
        model, quantization = data.get("model"), data.get("quantization")
        if model is not None and quantization and quantization not in model.quantizations:
            raise forms.ValidationError(f"{model.name} is not available as {quantization} "
                                        f"(it has {', '.join(model.quantizations)}).")
        if data.get("min_replicas") is None:
            data["min_replicas"] = 1
        if data.get("prefill_replicas") is None:
            data["prefill_replicas"] = 0
        if data["prefill_replicas"] and (data.get("engine_args") or {}).get("kv_offload_size", 0) in (0, "0"):
            self.add_error("prefill_replicas", "Prefill replicas send their blocks to the serving replicas' second "
                                               "tier: set engine_args.kv_offload_size (e.g. \"4GiB\") too.")
        high = data.get("max_replicas")
        if high is not None and (high < 1 or high < data["min_replicas"]):
            self.add_error("max_replicas", f"At least 1 and at least min_replicas ({data['min_replicas']}); "
                                           "blank: no autoscaling.")
        return data


@admin.register(Deployment)
class DeploymentAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = DeploymentForm
    list_display = ("name", "model", "quantization", "served_name", "desired_replicas", "min_replicas",
                    "max_replicas", "ready_replicas", "failed_replicas", "deleting")
    list_filter = ("quantization", "deleting", "model")
    search_fields = ("name", "served_name", "model__name")
    list_select_related = ("model",)
    readonly_fields = ("deleting", "created_at", "updated_at")
    # Replicas and their workers' health show in a read-only panel (admin/deployments/deployment/change_form.html).
    actions = ("retry_failed", "reconcile_now", "delete_through_service")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        deployment = self.get_object(request, object_id)
        if deployment is not None and self.has_view_or_change_permission(request, deployment):
            extra_context = {**(extra_context or {}), "panel": admin_panels.deployment_panel(deployment)}
        return super().change_view(request, object_id, form_url, extra_context)

    def has_retry_permission(self, request) -> bool:
        return _may(request, "retry_deployment")

    def has_reconcile_permission(self, request) -> bool:
        return _may(request, "reconcile_deployment")

    @admin.display(description="ready")
    def ready_replicas(self, deployment: Deployment) -> int:
        return deployment.replicas.filter(status=ReplicaStatus.READY).count()

    @admin.display(description="failed")
    def failed_replicas(self, deployment: Deployment) -> int:
        return deployment.replicas.filter(status=ReplicaStatus.FAILED).count()

    def get_readonly_fields(self, request, obj=None):
        fixed = ("name", "model", "quantization", "served_name")
        return self.readonly_fields + (fixed if obj is not None else ())

    def save_model(self, request, obj, form, change):
        if change:
            services.deployment_update(deployment=obj, replicas=obj.desired_replicas, placement=obj.placement,
                                       engine_args=obj.engine_args, max_adapters=obj.max_adapters,
                                       min_replicas=obj.min_replicas, max_replicas=obj.max_replicas,
                                       prefill_replicas=obj.prefill_replicas)
            return
        created = services.deployment_create(
            model=obj.model, replicas=obj.desired_replicas, quantization=obj.quantization, name=obj.name,
            served_name=obj.served_name or None, placement=obj.placement, engine_args=obj.engine_args,
            max_adapters=obj.max_adapters, min_replicas=obj.min_replicas, max_replicas=obj.max_replicas,
            prefill_replicas=obj.prefill_replicas)
        obj.pk, obj._state.adding = created.pk, False

    @admin.action(description="Retry the failed replicas", permissions=["retry"])
    def retry_failed(self, request, queryset):
        failed = Replica.objects.filter(deployment__in=queryset, status=ReplicaStatus.FAILED)
        for replica in failed:
            services.replica_retry(replica=replica)
        _report(self, request, len(failed), "replica(s) retrying", [])

    @admin.action(description="Reconcile now", permissions=["reconcile"])
    def reconcile_now(self, request, queryset):
        result = reconciler.reconcile()
        self.message_user(request, f"Reconciled: {result.as_dict()}", messages.SUCCESS)

    @admin.action(description="Unload and delete the selected deployments", permissions=["delete"])
    def delete_through_service(self, request, queryset):
        for deployment in queryset:
            services.deployment_delete(deployment=deployment)
        _report(self, request, len(queryset), "deployment(s) being deleted", [])


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("id", "deployment", "worker", "status_badge", "attempt", "failures", "reason", "ready_at",
                    "load_seconds")
    list_filter = ("status", "deployment", "worker")
    search_fields = ("deployment__name", "worker__name", "reason")
    list_select_related = ("deployment", "worker")
    readonly_fields = [f.name for f in Replica._meta.fields]
    actions = ("retry",)

    def has_add_permission(self, request) -> bool:
        return False  # deployments make replicas

    def has_retry_permission(self, request) -> bool:
        return _may(request, "retry_replica")

    @admin.display(description="status", ordering="status")
    def status_badge(self, replica: Replica):
        return badge(replica.status)

    @admin.action(description="Retry (failed replicas only)", permissions=["retry"])
    def retry(self, request, queryset):
        errors, done = [], 0
        for replica in queryset:
            try:
                services.replica_retry(replica=replica)
                done += 1
            except ApplicationError as exc:
                errors.append(exc.message)
        _report(self, request, done, "replica(s) retrying", errors)
