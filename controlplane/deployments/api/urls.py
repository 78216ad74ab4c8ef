from django.urls import path

from . import views

app_name = "deployments-api"

urlpatterns = [
    path("models/", views.ModelListView.as_view(), name="models"),
    path("models/<str:name>/", views.ModelDetailView.as_view(), name="model-detail"),
    path("workers/", views.WorkerListView.as_view(), name="workers"),
    path("workers/<str:name>/", views.WorkerDetailView.as_view(), name="worker-detail"),
    path("workers/<str:name>/drain/", views.WorkerDrainView.as_view(), name="worker-drain"),
    path("workers/<str:name>/uncordon/", views.WorkerUncordonView.as_view(), name="worker-uncordon"),
    path("deployments/", views.DeploymentListView.as_view(), name="deployments"),
    path("deployments/<str:name>/", views.DeploymentDetailView.as_view(), name="deployment-detail"),
    path("deployments/<str:name>/replicas/<int:replica_id>/retry/", views.ReplicaRetryView.as_view(),
         name="replica-retry"),
    path("adapters/", views.AdapterListView.as_view(), name="adapters"),
    path("adapters/<int:adapter_id>/", views.AdapterDetailView.as_view(), name="adapter-detail"),
    path("tenants/<slug:slug>/adapters/", views.AdapterListView.as_view(), name="tenant-adapters"),
    path("tenants/<slug:slug>/adapters/<int:adapter_id>/", views.AdapterDetailView.as_view(),
         name="tenant-adapter-detail"),
]
