"""Billing routes; mounted under /api/v1/billing/."""

from django.urls import path

from billing import economics_views, rate_views, views, webhooks

app_name = "billing"

urlpatterns = [
    path("exports/usage.csv", views.UsageExportView.as_view(file_format="csv"), name="export-usage-csv"),
    path("exports/usage.parquet", views.UsageExportView.as_view(file_format="parquet"), name="export-usage-parquet"),
    path("exports/invoices.csv", views.InvoiceExportView.as_view(file_format="csv"), name="export-invoices-csv"),
    path(
        "exports/invoices.parquet", views.InvoiceExportView.as_view(file_format="parquet"), name="export-invoices-parquet"
    ),
    path("worker-rates", rate_views.WorkerRateListView.as_view(), name="worker-rates"),
    path("unit-economics", economics_views.UnitEconomicsView.as_view(), name="unit-economics"),
    *[
        path(f"exports/unit-economics-{view}.{fmt}",
             economics_views.UnitEconomicsExportView.as_view(view=view, file_format=fmt),
             name=f"export-unit-economics-{view}-{fmt}")
        for view in ("tenants", "deployments") for fmt in ("csv", "parquet")
    ],
    path("stripe/webhook", webhooks.stripe_webhook, name="stripe-webhook"),
]
