from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_roles(sender, using: str = "default", **kwargs) -> None:
    from tenants.roles import roles_ensure  # lazy: models; Django imports apps.py before they can be

    roles_ensure(using=using)


class TenantsConfig(AppConfig):
    name = "tenants"
    label = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        # Keeps the operator and finance groups holding exactly their permissions (tenants/roles.py).
        post_migrate.connect(_ensure_roles, sender=self, dispatch_uid="tenants_roles")
