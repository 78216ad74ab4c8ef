from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_finance_group(sender, using: str = "default", **kwargs) -> None:
    from billing.services.roles import finance_group_ensure

    finance_group_ensure(using=using)


class BillingConfig(AppConfig):
    name = "billing"
    label = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        # After billing's (and auth's) permissions exist: keeps the finance group's view-only grants in place.
        post_migrate.connect(_ensure_finance_group, sender=self, dispatch_uid="billing_finance_group")

