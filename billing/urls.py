"""Billing routes; mounted under /api/v1/billing/."""

from django.urls import path

from billing import views, webhooks

app_name = "billing"

urlpatterns = [
    path("exports/usage.csv", views.UsageExportView.as_view(file_format="csv"), name="export-usage-csv"),
    path("exports/usage.parquet", views.UsageExportView.as_view(file_format="parquet"), name="export-usage-parquet"),
    path("exports/invoices.csv", views.InvoiceExportView.as_view(file_format="csv"), name="export-invoices-csv"),
    path(
        "exports/invoices.parquet", views.InvoiceExportView.as_view(file_format="parquet"), name="export-invoices-parquet"
    ),
    path("stripe/webhook", webhooks.stripe_webhook, name="stripe-webhook"),
]
