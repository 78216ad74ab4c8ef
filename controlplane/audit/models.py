"""The audit log: one append-only row per change that matters for access or money.

Rows are never updated or deleted by the application: `save()` inserts only, and the manager's
querysets refuse `update()` and `delete()`. On PostgreSQL a trigger (migration 0002) refuses
UPDATE and DELETE as well, unless the transaction set `tessera.audit_prune = 'on'`, which only the
retention prune (`controlplane.audit.retention`) does. No foreign keys: deleting a tenant, a key or
a user must never cascade into (or be blocked by) its history.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditImmutableError(Exception):
    """Raised on any attempt to change or remove an audit record through the ORM."""


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AuditImmutableError("audit events are append-only: update refused")

    def delete(self):
        raise AuditImmutableError("audit events are append-only: delete refused")

    def bulk_update(self, objs, fields, batch_size=None):
        raise AuditImmutableError("audit events are append-only: update refused")

    def _raw_delete(self, using):  # the deletion collector's fast path
        raise AuditImmutableError("audit events are append-only: delete refused")

    def update_or_create(self, *args, **kwargs):
        raise AuditImmutableError("audit events are append-only: update refused")


class ActorType(models.TextChoices):
    USER = "user", "Django user"
    API_KEY = "api_key", "tenant API key"
    SYSTEM = "system", "system (command or task)"
    ANONYMOUS = "anonymous", "unauthenticated request"


class Channel(models.TextChoices):
    ADMIN = "admin", "Django admin"
    API = "api", "management API"
    CLI = "cli", "manage.py command"
    TASK = "task", "Celery task"
    OTHER = "other", "other"


class AuditEvent(models.Model):
    at = models.DateTimeField(default=timezone.now, db_index=True)
    # Who: a Django user (id + username), a tenant's key (id + prefix) or "system:<command or task>".
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor = models.CharField(max_length=200, help_text="who, as one readable string")
    actor_user_id = models.BigIntegerField(null=True, blank=True)
    actor_username = models.CharField(max_length=150, blank=True, default="")
    actor_key_id = models.BigIntegerField(null=True, blank=True)
    actor_key_prefix = models.CharField(max_length=16, blank=True, default="")
    # What.
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True, default="")
    object_repr = models.CharField(max_length=200, blank=True, default="")
    # The tenant the object belongs to (NULL: tiers, prices, deployments, users); tenants read only theirs.
    tenant_id = models.BigIntegerField(null=True, blank=True)
    # {field: [before, after]}; secrets appear only as "[redacted]".
    changes = models.JSONField(default=dict, blank=True)
    # From where.
    channel = models.CharField(max_length=8, choices=Channel.choices)
    via = models.CharField(max_length=300, blank=True, default="", help_text="HTTP method and path, command or task")
    client_address = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="", db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["tenant_id", "at"]), models.Index(fields=["object_type", "object_id"])]
        # Nobody gets add/change/delete through the admin or roles; only the view permission means anything.
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type}:{self.object_id}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AuditImmutableError("audit events are append-only: update refused")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AuditImmutableError("audit events are append-only: delete refused")
