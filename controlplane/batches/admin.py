"""Django admin for files and batches: what an operator looks at when a tenant asks "where is my
batch?". Read-only (a batch's state belongs to its runner and the tenant's API calls); the one
action is cancel, through the same service as the tenant's POST /v1/batches/{id}/cancel."""

from __future__ import annotations

from django.contrib import admin, messages

from billing.admin import ReadOnlyAdmin as ReadOnly
from common.errors import ApplicationError

from .models import Batch, BatchLine, StoredFile
from .services import batch_cancel


@admin.register(StoredFile)
class StoredFileAdmin(ReadOnly):
    list_display = ("id", "tenant", "purpose", "filename", "bytes", "lines", "created_at")
    list_filter = ("purpose",)
    search_fields = ("id", "filename", "tenant__name")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"


@admin.register(Batch)
class BatchAdmin(ReadOnly):
    list_display = ("id", "tenant", "status", "endpoint", "request_total", "request_completed", "request_failed",
                    "created_at", "completed_at")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "tenant__name", "input_file_id", "output_file_id")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"
    actions = ("cancel_batches",)

    @admin.action(description="Cancel the selected batches (answered lines are kept)",
                  permissions=("cancel",))
    def cancel_batches(self, request, queryset) -> None:
        done = 0
        for batch in queryset:
            try:
                batch_cancel(tenant_id=batch.tenant_id, batch_id=batch.pk)
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"{batch.pk}: {exc.message}", messages.WARNING)
        self.message_user(request, f"{done} batch(es) cancelling or cancelled.")

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("batches.change_batch")


@admin.register(BatchLine)
class BatchLineAdmin(ReadOnly):
    """One batch's lines: filter by batch id (?batch__id__exact=...) and state, search a custom_id or
    the request id the ledger bills it under."""

    list_display = ("batch", "line_no", "custom_id", "state", "attempts", "status_code", "request_id")
    list_filter = ("state",)
    search_fields = ("=batch__id", "custom_id", "=request_id")
    ordering = ("batch", "line_no")
    show_full_result_count = False  # a batch has up to 50,000 lines: no COUNT(*) over all of them per page
