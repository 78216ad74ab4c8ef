"""URLconf for billing tests: mounts billing where controlplane/urls.py will (/api/v1/billing/)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/billing/", include("billing.urls")),
]
