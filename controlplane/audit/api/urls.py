from django.urls import path

from . import views

app_name = "audit-api"

urlpatterns = [
    path("audit-events/", views.AuditEventListView.as_view(), name="events"),
    path("audit-events/export.csv", views.AuditExportView.as_view(file_format="csv"), name="export-csv"),
    path("audit-events/export.jsonl", views.AuditExportView.as_view(file_format="jsonl"), name="export-jsonl"),
    path("tenants/<slug:slug>/audit-events/", views.TenantAuditEventListView.as_view(), name="tenant-events"),
]
