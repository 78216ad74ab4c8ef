"""Management API views, one per operation. Operators (Django staff) own models, workers and
deployments; a tenant's key with can_manage owns its adapters (operators reach any tenant's
adapters under /api/v1/tenants/<slug>/adapters/)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from common.errors import NotFound
from common.pagination import Pages
from tenants.api.operator_views import OperatorView
from tenants.api.views import TenantScopedView

from .. import selectors, services
from . import serializers as s


class Paged:
    """A list answered one page (common/pagination.py) at a time. APIView ignores `pagination_class`,
    but drf-spectacular reads it: without it the schema called these lists bare arrays, which
    generated clients and schemathesis' response check (and its links from a list to its items) read
    wrong. The page envelope and `limit`/`offset` are now in the schema."""

    pagination_class = Pages


def _page(view, request: Request, queryset, serializer_class) -> Response:
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


def _valid(serializer_class, request: Request, **kwargs) -> dict:
    body = serializer_class(data=request.data, **kwargs)
    body.is_valid(raise_exception=True)
    return dict(body.validated_data)


# --- models ---------------------------------------------------------------------------------------

class ModelListView(Paged, OperatorView):
    @extend_schema(responses=s.ModelSerializer(many=True), summary="List models")
    def get(self, request: Request) -> Response:
        return _page(self, request, selectors.model_list(), s.ModelSerializer)

    @extend_schema(request=s.ModelSerializer, responses={201: s.ModelSerializer}, summary="Register a model")
    def post(self, request: Request) -> Response:
        model = services.model_create(**_valid(s.ModelSerializer, request))
        return Response(s.ModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelDetailView(OperatorView):
    @extend_schema(responses=s.ModelSerializer, summary="Show a model")
    def get(self, request: Request, name: str) -> Response:
        return Response(s.ModelSerializer(selectors.model_get(name=name)).data)

    @extend_schema(request=s.ModelUpdateSerializer, responses=s.ModelSerializer, summary="Change a model")
    def patch(self, request: Request, name: str) -> Response:
        fields = _valid(s.ModelUpdateSerializer, request, partial=True)
        model = services.model_update(model=selectors.model_get(name=name), **fields)
        return Response(s.ModelSerializer(model).data)

    @extend_schema(responses={204: None}, summary="Remove a model nothing uses")
    def delete(self, request: Request, name: str) -> Response:
        services.model_delete(model=selectors.model_get(name=name))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- workers --------------------------------------------------------------------------------------

class WorkerListView(Paged, OperatorView):
    @extend_schema(responses=s.WorkerSerializer(many=True), summary="List workers with their load")
    def get(self, request: Request) -> Response:
        return _page(self, request, selectors.worker_list(), s.WorkerSerializer)


class WorkerDetailView(OperatorView):
    @extend_schema(responses=s.WorkerSerializer, summary="Show a worker")
    def get(self, request: Request, name: str) -> Response:
        return Response(s.WorkerSerializer(selectors.worker_get(name=name)).data)


class WorkerDrainView(OperatorView):
    @extend_schema(request=None, responses=s.WorkerSerializer, summary="Drain (cordon): move its replicas away")
    def post(self, request: Request, name: str) -> Response:
        worker = services.worker_cordon(worker=selectors.worker_get(name=name), cordoned=True)
        return Response(s.WorkerSerializer(worker).data)


class WorkerUncordonView(OperatorView):
    @extend_schema(request=None, responses=s.WorkerSerializer, summary="Take new replicas again")
    def post(self, request: Request, name: str) -> Response:
        worker = services.worker_cordon(worker=selectors.worker_get(name=name), cordoned=False)
        return Response(s.WorkerSerializer(worker).data)


# --- deployments ----------------------------------------------------------------------------------

class DeploymentListView(Paged, OperatorView):
    @extend_schema(responses=s.DeploymentSerializer(many=True), summary="List deployments")
    def get(self, request: Request) -> Response:
        return _page(self, request, selectors.deployment_list(), s.DeploymentSerializer)

    @extend_schema(request=s.DeploymentCreateSerializer, responses={201: s.DeploymentSerializer},
                   summary="Deploy a model at a quantization on N workers")
    def post(self, request: Request) -> Response:
        deployment = services.deployment_create(**_valid(s.DeploymentCreateSerializer, request))
        return Response(s.DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)


class DeploymentDetailView(OperatorView):
    @extend_schema(responses=s.DeploymentSerializer, summary="Show a deployment and its replicas")
    def get(self, request: Request, name: str) -> Response:
        return Response(s.DeploymentSerializer(selectors.deployment_get(name=name)).data)

    @extend_schema(request=s.DeploymentUpdateSerializer, responses=s.DeploymentSerializer,
                   summary="Scale or reconfigure a deployment")
    def patch(self, request: Request, name: str) -> Response:
        fields = _valid(s.DeploymentUpdateSerializer, request)
        deployment = services.deployment_update(deployment=selectors.deployment_get(name=name), **fields)
        return Response(s.DeploymentSerializer(selectors.deployment_get(name=deployment.name)).data)

    @extend_schema(responses={202: None}, summary="Delete: unload every replica, then remove")
    def delete(self, request: Request, name: str) -> Response:
        services.deployment_delete(deployment=selectors.deployment_get(name=name))
        return Response(status=status.HTTP_202_ACCEPTED)


class ReplicaRetryView(OperatorView):
    @extend_schema(request=None, responses=s.ReplicaSerializer, summary="Retry a failed replica")
    def post(self, request: Request, name: str, replica_id: int) -> Response:
        deployment = selectors.deployment_get(name=name)
        replica = deployment.replicas.filter(pk=replica_id).first()
        if replica is None:
            raise NotFound(f"No replica {replica_id} in {name!r}.")
        return Response(s.ReplicaSerializer(services.replica_retry(replica=replica)).data)


# --- adapters (tenant-owned) ----------------------------------------------------------------------

def _adapter_serializer(kwargs: dict):
    """Tenants read a failure's fixed wording; operators (the /tenants/<slug>/ routes) the worker's words too."""
    return s.OperatorAdapterSerializer if "slug" in kwargs else s.AdapterSerializer


class AdapterListView(Paged, TenantScopedView):
    @extend_schema(responses=s.AdapterSerializer(many=True), summary="List your adapters")
    def get(self, request: Request, **kwargs) -> Response:
        return _page(self, request, selectors.adapter_list(tenant=self.tenant(request)), _adapter_serializer(kwargs))

    @extend_schema(request=s.AdapterCreateSerializer, responses={201: s.AdapterSerializer},
                   summary="Register a LoRA adapter; it is loaded wherever its base model runs with LoRA slots")
    def post(self, request: Request, **kwargs) -> Response:
        adapter = services.adapter_create(tenant=self.tenant(request), **_valid(s.AdapterCreateSerializer, request))
        return Response(_adapter_serializer(kwargs)(adapter).data, status=status.HTTP_201_CREATED)


class AdapterDetailView(TenantScopedView):
    @extend_schema(responses=s.AdapterSerializer, summary="Show one of your adapters")
    def get(self, request: Request, adapter_id: int, **kwargs) -> Response:
        adapter = selectors.adapter_get(tenant=self.tenant(request), adapter_id=adapter_id)
        return Response(_adapter_serializer(kwargs)(adapter).data)

    @extend_schema(responses={202: None}, summary="Delete: unload everywhere, then remove")
    def delete(self, request: Request, adapter_id: int, **kwargs) -> Response:
        services.adapter_delete(adapter=selectors.adapter_get(tenant=self.tenant(request), adapter_id=adapter_id))
        return Response(status=status.HTTP_202_ACCEPTED)
