from django.urls import path

from . import views

app_name = "deployments-internal"

urlpatterns = [
    path("health", views.HealthView.as_view(), name="health"),
    path("workers/register", views.RegisterView.as_view(), name="register"),
    path("workers/<str:name>/heartbeat", views.HeartbeatView.as_view(), name="heartbeat"),
    path("workers/<str:name>/release", views.ReleaseView.as_view(), name="release"),
    path("workers/<str:name>/drain", views.DrainView.as_view(), name="drain"),
    path("workers/<str:name>/replicas/<int:replica_id>", views.ReplicaSpecView.as_view(), name="replica"),
    path("workers/<str:name>/replicas/<int:replica_id>/status", views.ReplicaStatusView.as_view(),
         name="replica-status"),
    path("workers/<str:name>/adapters/<int:placement_id>", views.PlacementSpecView.as_view(), name="placement"),
    path("workers/<str:name>/adapters/<int:placement_id>/status", views.PlacementStatusView.as_view(),
         name="placement-status"),
]
