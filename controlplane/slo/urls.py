from django.urls import path

from .api import SLOStatusView

app_name = "slo"
urlpatterns = [path("", SLOStatusView.as_view(), name="status")]
