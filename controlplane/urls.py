from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from controlplane.health import healthz, readyz
from controlplane.slo.views import prometheus_metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    # Liveness (the process answers) and readiness (PostgreSQL and, where used, Redis answer).
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    # The OpenAI-compatible gateway (async views).
    path("v1/", include("controlplane.gateway.urls")),
    # The management API (DRF), its OpenAPI schema and browsable docs.
    path("api/v1/billing/", include("billing.urls")),
    path("api/v1/slo/", include("controlplane.slo.urls")),
    # Prometheus: request counters, gateway latency, worker health, SLO gauges (controlplane/slo/metrics.py).
    path("metrics", prometheus_metrics, name="metrics"),
    path("api/v1/", include("tenants.api.urls")),
    path("api/v1/", include("controlplane.deployments.api.urls")),
    # Workers register, heartbeat and report task outcomes here (worker token).
    path("internal/v1/", include("controlplane.deployments.internal.urls")),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
]
