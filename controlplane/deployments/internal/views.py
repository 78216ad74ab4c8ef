"""Worker-facing endpoints (one view per operation); each calls one service or selector."""

from __future__ import annotations

import hmac
from urllib.parse import urlparse

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import ApplicationError

from .. import selectors, services
from ..models import ReplicaStatus, Worker, name_validator
from .auth import IsWorker, WorkerTokenAuthentication

BOOT_ID_HEADER = "X-Tessera-Boot-Id"


class RegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=128, validators=[name_validator])
    url = serializers.CharField(max_length=300)
    boot_id = serializers.CharField(max_length=64)
    accelerator = serializers.CharField(max_length=128, required=False, allow_blank=True, default="")
    memory_bytes = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=0)
    device_count = serializers.IntegerField(required=False, default=1, min_value=1, max_value=1024)
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
    # adapters: not_found / invalid / too_large / error, which picks the tenant's wording
    kind = serializers.CharField(required=False, allow_blank=True, default="", max_length=16)
    load_seconds = serializers.FloatField(required=False, allow_null=True, default=None)
    gate = serializers.DictField(required=False, allow_null=True, default=None)
    load_curve = serializers.DictField(required=False, allow_null=True, default=None)  # capacity/curve.py


@extend_schema(exclude=True)
class WorkerView(APIView):
    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]

    def worker(self, name: str) -> Worker:
        return selectors.worker_get(name=name)

    def bound_worker(self, request: Request, name: str) -> Worker:
        """The worker, if the caller is the boot that registered it (X-Tessera-Boot-Id); else 409."""
        worker = self.worker(name)
        boot_id = request.headers.get(BOOT_ID_HEADER, "")
        if not worker.boot_id or not hmac.compare_digest(boot_id.encode(), worker.boot_id.encode()):
            raise ApplicationError(f"Not the registered boot of worker {name!r}; register again.",
                                   code="worker_reregister", status=409)
        return worker

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


class ReleaseView(WorkerView):
    """A worker stopping cleanly gives its name up, so that its next boot registers at once."""

    def post(self, request: Request, name: str) -> Response:
        worker = services.worker_release(worker=self.bound_worker(request, name), reason=f"worker {name} stopped")
        return Response({"released": True, "worker": worker.name})


class DrainView(WorkerView):
    """The worker's own preStop hook: cordon it; say how many of its replicas still wait for a replacement."""

    def post(self, request: Request, name: str) -> Response:
        worker = services.worker_cordon(worker=self.worker(name), cordoned=True)
        waiting = worker.replicas.filter(status__in=[ReplicaStatus.LOADING, ReplicaStatus.READY]).count()
        return Response({"cordoned": True, "waiting_for": waiting})


class ReplicaSpecView(WorkerView):
    def get(self, request: Request, name: str, replica_id: int) -> Response:
        return Response(selectors.replica_spec(worker=self.bound_worker(request, name), replica_id=replica_id))


class ReplicaStatusView(WorkerView):
    def post(self, request: Request, name: str, replica_id: int) -> Response:
        body = self.body(request, ReportSerializer)
        body.pop("kind", None)
        return Response(services.replica_report(worker=self.bound_worker(request, name), replica_id=replica_id, **body))


class PlacementSpecView(WorkerView):
    def get(self, request: Request, name: str, placement_id: int) -> Response:
        return Response(selectors.placement_spec(worker=self.bound_worker(request, name), placement_id=placement_id))


class PlacementStatusView(WorkerView):
    def post(self, request: Request, name: str, placement_id: int) -> Response:
        body = self.body(request, ReportSerializer)
        body.pop("load_seconds", None)
        body.pop("gate", None)
        body.pop("load_curve", None)
        return Response(services.placement_report(worker=self.bound_worker(request, name), placement_id=placement_id, **body))


@extend_schema(exclude=True)
class HealthView(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request: Request) -> Response:
        return Response({"status": "ok"})
