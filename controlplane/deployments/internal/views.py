"""Worker-facing endpoints (one view per operation); each calls one service or selector."""

from __future__ import annotations

from urllib.parse import urlparse

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import selectors, services
from ..models import ReplicaStatus, Worker, name_validator
from .auth import IsWorker, WorkerTokenAuthentication


class RegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=128, validators=[name_validator])
    url = serializers.CharField(max_length=300)
    boot_id = serializers.CharField(max_length=64)
    accelerator = serializers.CharField(max_length=128, required=False, allow_blank=True, default="")
    memory_bytes = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=0)
    labels = serializers.DictField(child=serializers.CharField(), required=False, default=dict)
    status = serializers.ChoiceField(choices=["starting", "ready", "draining"], default="starting")


    def validate_url(self, value: str) -> str:
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise serializers.ValidationError("An http(s)://host:port base URL (any host name, e.g. worker-0).")
        return value.rstrip("/")


class HeartbeatSerializer(serializers.Serializer):
    boot_id = serializers.CharField(max_length=64)
    status = serializers.ChoiceField(choices=["starting", "ready", "draining"])
    slot = serializers.DictField(required=False, default=dict)
    adapters = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    running = serializers.IntegerField(min_value=0, default=0)
    waiting = serializers.IntegerField(min_value=0, default=0)
    kv_cache_usage = serializers.FloatField(min_value=0, default=0.0)
    stats = serializers.DictField(required=False, default=dict)


class ReportSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(min_value=0)
    status = serializers.ChoiceField(choices=["loading", "ready", "failed", "stopped"])
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=4000)
    permanent = serializers.BooleanField(required=False, default=False)
    load_seconds = serializers.FloatField(required=False, allow_null=True, default=None)
    gate = serializers.DictField(required=False, allow_null=True, default=None)


@extend_schema(exclude=True)
class WorkerView(APIView):
    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]

    def worker(self, name: str) -> Worker:
        return selectors.worker_get(name=name)

    def body(self, request: Request, serializer_class) -> dict:
        serializer = serializer_class(data=request.data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)


class RegisterView(WorkerView):
    def post(self, request: Request) -> Response:
        worker = services.worker_register(**self.body(request, RegisterSerializer))
        return Response(services.worker_report(worker))


class HeartbeatView(WorkerView):
    def post(self, request: Request, name: str) -> Response:
        worker = services.worker_heartbeat(worker=self.worker(name), **self.body(request, HeartbeatSerializer))
        return Response(services.worker_report(worker))


class DrainView(WorkerView):
    """The worker's own preStop hook: cordon it; say how many of its replicas still wait for a replacement."""

    def post(self, request: Request, name: str) -> Response:
        worker = services.worker_cordon(worker=self.worker(name), cordoned=True)
        waiting = worker.replicas.filter(status__in=[ReplicaStatus.LOADING, ReplicaStatus.READY]).count()
        return Response({"cordoned": True, "waiting_for": waiting})


class ReplicaSpecView(WorkerView):
    def get(self, request: Request, name: str, replica_id: int) -> Response:
        return Response(selectors.replica_spec(worker=self.worker(name), replica_id=replica_id))


class ReplicaStatusView(WorkerView):
    def post(self, request: Request, name: str, replica_id: int) -> Response:
        body = self.body(request, ReportSerializer)
        return Response(services.replica_report(worker=self.worker(name), replica_id=replica_id, **body))


class PlacementSpecView(WorkerView):
    def get(self, request: Request, name: str, placement_id: int) -> Response:
        return Response(selectors.placement_spec(worker=self.worker(name), placement_id=placement_id))


class PlacementStatusView(WorkerView):
    def post(self, request: Request, name: str, placement_id: int) -> Response:
        body = self.body(request, ReportSerializer)
        body.pop("load_seconds", None)
        body.pop("gate", None)
        return Response(services.placement_report(worker=self.worker(name), placement_id=placement_id, **body))


@extend_schema(exclude=True)
class HealthView(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request: Request) -> Response:
        return Response({"status": "ok"})
