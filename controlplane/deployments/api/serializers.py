"""Parse and format only; every write goes through controlplane.deployments.services."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import Adapter, AutoscalerState, Deployment, Model, Quantization, Replica, Worker
from ..selectors import deployment_summary

MAX_REPLICAS = 10_000  # far above any fleet; keeps the integer inside PostgreSQL's column


class ModelSerializer(serializers.ModelSerializer):
    source_kind = serializers.CharField(read_only=True)
    quantizations = serializers.ListField(child=serializers.CharField(), required=False)
    quantized_sources = serializers.DictField(child=serializers.CharField(), required=False)

    class Meta:
        model = Model
        fields = ["id", "name", "source", "source_kind", "architecture", "context_length", "quantizations",
                  "quantized_sources", "description", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]
        extra_kwargs = {"name": {"validators": []}, "source": {"required": False}}


class ModelUpdateSerializer(ModelSerializer):
    class Meta(ModelSerializer.Meta):
        read_only_fields = ["id", "name", "created_at", "updated_at"]


class ReplicaSerializer(serializers.ModelSerializer):
    worker = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Replica
        fields = ["id", "uid", "worker", "role", "status", "reason", "attempt", "failures", "retry_at", "dispatched_at",
                  "ready_at", "load_seconds", "gate", "created_at", "updated_at"]
        read_only_fields = fields


class WorkerSerializer(serializers.ModelSerializer):
    replica = serializers.SerializerMethodField()

    class Meta:
        model = Worker
        fields = ["id", "name", "url", "queue", "accelerator", "memory_bytes", "labels", "status", "cordoned",
                  "registered_at", "last_heartbeat_at", "loaded_model", "loaded_adapters", "num_running",
                  "num_waiting", "kv_cache_usage", "stats", "replica"]
        read_only_fields = fields

    def get_replica(self, worker: Worker) -> dict | None:
        replica = worker.replicas.exclude(status__in=["pending", "failed"]).select_related("deployment").first()
        if replica is None:
            return None
        return {"id": replica.pk, "deployment": replica.deployment.name, "status": replica.status}


class AutoscalerSerializer(serializers.ModelSerializer):
    class Meta:
        model = AutoscalerState
        fields = ["recommended", "reason", "detail", "signals", "last_up_at", "last_down_at", "low_since", "ups",
                  "downs", "cold_starts", "updated_at"]
        read_only_fields = fields


class DeploymentSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    replicas = serializers.IntegerField(source="desired_replicas", read_only=True)
    status = serializers.SerializerMethodField()
    # Declared: left to the model, the reverse one-to-one became the state's primary key (an integer, or a
    # null the schema did not allow) and get_autoscaler was never called.
    autoscaler = serializers.SerializerMethodField()
    replica_status = ReplicaSerializer(source="replicas", many=True, read_only=True)

    class Meta:
        model = Deployment
        fields = ["id", "name", "model", "quantization", "replicas", "min_replicas", "max_replicas", "autoscaler",
                  "served_name", "placement", "engine_args", "max_adapters", "prefill_replicas", "deleting", "status",
                  "replica_status",
                  "created_at", "updated_at"]
        read_only_fields = fields

    def get_status(self, deployment: Deployment) -> dict[str, int]:
        return deployment_summary(deployment)

    @extend_schema_field(AutoscalerSerializer(allow_null=True))
    def get_autoscaler(self, deployment: Deployment) -> dict | None:
        state = getattr(deployment, "autoscaler", None)
        return None if state is None else AutoscalerSerializer(state).data


def _check_bounds(data: dict) -> dict:
    """max < min in one body is refused here, field by field; the service checks a PATCH of one
    bound against the stored other."""
    low, high = data.get("min_replicas"), data.get("max_replicas")
    if low is not None and high is not None and high < low:
        raise serializers.ValidationError({"max_replicas": [f"{high} is below min_replicas {low}."]})
    return data


class DeploymentCreateSerializer(serializers.Serializer):
    model = serializers.SlugRelatedField(slug_field="name", queryset=Model.objects.all())
    replicas = serializers.IntegerField(min_value=0, default=1)
    quantization = serializers.CharField(default=Quantization.BF16.value, help_text="bf16, fp8, awq-int4 (awq) or gguf")
    name = serializers.CharField(max_length=128, required=False)
    served_name = serializers.CharField(max_length=128, required=False)
    placement = serializers.DictField(required=False, default=dict)
    engine_args = serializers.DictField(required=False, default=dict)
    max_adapters = serializers.IntegerField(min_value=0, max_value=256, default=0)
    prefill_replicas = serializers.IntegerField(min_value=0, max_value=64, default=0,
                                                help_text="Replicas that compute long prompts for the others "
                                                          "(disaggregated prefill); needs engine_args.kv_offload_size.")
    min_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, default=1,
                                            help_text="Autoscaling's floor; 0 scales to zero when idle.")
    max_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False, allow_null=True,
                                            help_text="Autoscaling's ceiling; absent or null: no autoscaling.")

    def validate(self, data: dict) -> dict:
        return _check_bounds(data)


class DeploymentUpdateSerializer(serializers.Serializer):
    replicas = serializers.IntegerField(min_value=0, required=False)
    placement = serializers.DictField(required=False)
    engine_args = serializers.DictField(required=False)
    max_adapters = serializers.IntegerField(min_value=0, max_value=256, required=False)
    prefill_replicas = serializers.IntegerField(min_value=0, max_value=64, required=False)
    min_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False, allow_null=True,
                                            help_text="null turns autoscaling off (replicas stay as they are).")

    def validate(self, data: dict) -> dict:
        return _check_bounds(data)


class AdapterSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    base_model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    ready_placements = serializers.SerializerMethodField()

    class Meta:
        model = Adapter
        fields = ["id", "tenant", "name", "served_name", "base_model", "source", "rank", "status", "reason",
                  "ready_placements", "created_at", "updated_at"]
        read_only_fields = fields

    def get_ready_placements(self, adapter: Adapter) -> int:
        return adapter.placements.filter(status="ready").count()


class OperatorAdapterSerializer(AdapterSerializer):
    """Operators (/api/v1/tenants/<slug>/adapters/) also read the worker's own account of a failure."""

    class Meta(AdapterSerializer.Meta):
        fields = [*AdapterSerializer.Meta.fields, "reason_detail"]
        read_only_fields = fields


class AdapterCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    base_model = serializers.SlugRelatedField(slug_field="name", queryset=Model.objects.all())
    source = serializers.CharField(max_length=500)
    rank = serializers.IntegerField(min_value=1, max_value=64, default=8)
