"""For ModelAdmins that save or delete rows themselves instead of calling a service.

Put first in the bases: an admin's own `save_model` that calls a service (which records) never
reaches this one; only its `super().save_model(...)`, the plain ORM save, is recorded here.
"""

from __future__ import annotations

from .writer import change, record

# Action names follow the services' (`api_key.revoke`), not Django's model names (`apikey`).
FAMILIES = {"apikey": "api_key"}


def family(obj) -> str:
    return FAMILIES.get(obj._meta.model_name, obj._meta.model_name)


class AuditedAdminMixin:
    def save_model(self, request, obj, form, change_, *args, **kwargs):
        label = family(obj)
        if not change_:
            super().save_model(request, obj, form, change_, *args, **kwargs)
            record(f"{label}.create", obj)
            return
        with change(f"{label}.update", obj):
            super().save_model(request, obj, form, change_, *args, **kwargs)

    def delete_model(self, request, obj):
        with change(f"{family(obj)}.delete", obj):
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)
