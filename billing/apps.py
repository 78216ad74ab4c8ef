from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    label = "billing"
    verbose_name = "Billing"
    # The finance group is kept in place after migrate by tenants.apps (tenants/roles.py).
