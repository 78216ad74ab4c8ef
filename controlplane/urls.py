from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

from controlplane.health import healthz, readyz
from controlplane.slo.views import prometheus_metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    # Single sign-on for the admin (OpenID Connect); /sso/callback/ is the provider's redirect URI.
    path("sso/", include("controlplane.sso.urls")),
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
    path("api/v1/", include("controlplane.audit.api.urls")),
    # Workers register, heartbeat and report task outcomes here (worker token).
    path("internal/v1/", include("controlplane.deployments.internal.urls")),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI and ReDoc from this server's static files with no inline script (the split view loads
    # its set-up script from ?script), so their pages keep a 'self' policy (controlplane/doors/headers.py).
    path("api/v1/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/redoc/", SpectacularRedocView.as_view(url_name="schema", template_name="api_docs/redoc.html"),
         name="api-redoc"),
]
