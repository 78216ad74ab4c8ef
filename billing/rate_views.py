"""/api/v1/billing/worker-rates: the worker-class rate book. Finance and operators read it; only
operators add to it (through `worker_rate_create`, audited; rows are never edited or deleted)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.errors import BillingError
from billing.models import WorkerClassRate
from billing.services import worker_rate_create
from common.pagination import Pages
from tenants.api.permissions import IsFinance, IsOperator


class WorkerRateSerializer(serializers.ModelSerializer):
    class Meta:
        model = WorkerClassRate
        fields = ["id", "worker_class", "currency", "hourly_cost", "prefill_tokens_per_second",
                  "decode_tokens_per_second", "effective_from", "effective_to", "note", "created_at"]
        read_only_fields = ["id", "created_at"]


class WorkerRateListView(APIView):
    pagination_class = Pages

    def get_permissions(self):
        return [IsOperator()] if self.request.method == "POST" else [IsFinance()]

    @extend_schema(responses=WorkerRateSerializer(many=True), summary="List worker-class rates")
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(WorkerClassRate.objects.order_by("worker_class", "-effective_from"),
                                           request, view=self)
        return paginator.get_paginated_response(WorkerRateSerializer(page, many=True).data)

    @extend_schema(request=WorkerRateSerializer, responses={201: WorkerRateSerializer},
                   summary="Add a worker-class rate (closes the class's open rate)")
    def post(self, request: Request) -> Response:
        body = WorkerRateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            rate = worker_rate_create(**body.validated_data)
        except BillingError as exc:
            raise exceptions.ValidationError({"detail": str(exc)}) from None
        return Response(WorkerRateSerializer(rate).data, status=status.HTTP_201_CREATED)
