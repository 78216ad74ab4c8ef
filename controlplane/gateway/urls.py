from django.urls import path

from . import views

app_name = "gateway"

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
    path("models/<path:model>", views.model_detail, name="model-detail"),
    path("<path:rest>", views.not_found, name="not-found"),
]
