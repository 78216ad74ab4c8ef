from django.urls import path

from . import operator_views as ops
from . import views

app_name = "tenants-api"

# The same key views answer for a tenant's own key (no slug) and for operators (with slug).
_key_routes = [
    ("keys/", views.KeyListView, "keys"),
    ("keys/<int:key_id>/", views.KeyDetailView, "key-detail"),
    ("keys/<int:key_id>/revoke/", views.KeyRevokeView, "key-revoke"),
    ("keys/<int:key_id>/rotate/", views.KeyRotateView, "key-rotate"),
]

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("usage/", views.UsageView.as_view(), name="usage"),
    *[path(route, view.as_view(), name=name) for route, view, name in _key_routes],
    path("tenants/", ops.TenantListView.as_view(), name="tenants"),
    path("tenants/<slug:slug>/", ops.TenantDetailView.as_view(), name="tenant-detail"),
    path("tenants/<slug:slug>/suspend/", ops.TenantSuspendView.as_view(), name="tenant-suspend"),
    path("tenants/<slug:slug>/activate/", ops.TenantActivateView.as_view(), name="tenant-activate"),
    path("tenants/<slug:slug>/usage/", views.UsageView.as_view(), name="tenant-usage"),
    *[
        path(f"tenants/<slug:slug>/{route}", view.as_view(), name=f"tenant-{name}")
        for route, view, name in _key_routes
    ],
    path("tiers/", ops.TierListView.as_view(), name="tiers"),
    path("tiers/<slug:name>/", ops.TierDetailView.as_view(), name="tier-detail"),
]
