"""The control plane's `GET /metrics` (Prometheus text format)."""

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST

from . import metrics


def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(metrics.render(), content_type=CONTENT_TYPE_LATEST)
