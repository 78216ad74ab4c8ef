"""The audit log in the admin: operators and finance read it with filters; nobody adds, changes or
deletes (not even a superuser: these answers do not ask the permission system)."""

from __future__ import annotations

from django.contrib import admin

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "object_type", "object_repr", "tenant_id", "channel", "client_address",
                    "request_id")
    list_filter = ("action", "actor_type", "channel", "object_type", "at")
    search_fields = ("actor", "actor_username", "actor_key_prefix", "object_repr", "object_id", "request_id", "=tenant_id")
    date_hierarchy = "at"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]
    show_full_result_count = False  # no count(*) over a long history on every page
    actions = None  # no "delete selected"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
