from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    label = "tenants"
    verbose_name = "Tenants"
