from django.urls import include, path

from controlplane.gateway import views
from controlplane.gateway.responses import responses_api

app_name = "gateway"

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("embeddings", views.embeddings, name="embeddings"),
    path("responses", responses_api.create, name="responses"),
    path("responses/<str:response_id>", responses_api.detail, name="response-detail"),
    path("responses/<str:response_id>/input_items", responses_api.input_items, name="response-input-items"),
    path("models", views.models, name="models"),
    path("models/<path:model>", views.model_detail, name="model-detail"),
    path("", include("controlplane.batches.urls")),  # /v1/files, /v1/batches
    path("<path:rest>", views.not_found, name="not-found"),
]
