from __future__ import annotations

from rest_framework import serializers

from ..models import ActorType, AuditEvent

FIELDS = ["id", "at", "actor_type", "actor", "actor_user_id", "actor_username", "actor_key_id", "actor_key_prefix",
          "action", "object_type", "object_id", "object_repr", "tenant_id", "changes", "channel", "via",
          "client_address", "request_id"]


class AuditEventSerializer(serializers.ModelSerializer):
    """Operators and finance: everything the record holds."""

    class Meta:
        model = AuditEvent
        fields = FIELDS
        read_only_fields = FIELDS


class TenantAuditEventSerializer(serializers.ModelSerializer):
    """A tenant's own view: what happened to its objects and which of its keys did it. A person's
    identity and address stay with the operator: a staff member is shown as "operator"."""

    actor = serializers.SerializerMethodField()
    client_address = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor_type", "actor", "actor_key_id", "actor_key_prefix", "action", "object_type",
                  "object_id", "object_repr", "changes", "channel", "client_address", "request_id"]
        read_only_fields = fields

    def _by_own_key(self, event: AuditEvent) -> bool:
        return event.actor_type == ActorType.API_KEY

    def get_actor(self, event: AuditEvent) -> str:
        if event.actor_type == ActorType.USER:
            return "operator"
        return event.actor

    def get_client_address(self, event: AuditEvent) -> str | None:
        return event.client_address if self._by_own_key(event) else None


class _Page(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class TenantAuditEventPageSerializer(_Page):
    results = TenantAuditEventSerializer(many=True)


class AuditEventPageSerializer(_Page):
    results = AuditEventSerializer(many=True)
