from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    label = "billing"
    verbose_name = "Billing"
    # The finance group is kept in place after migrate by tenants.apps (tenants/roles.py).

    def ready(self) -> None:
        # Connects the receiver that turns the services' stripe_push_wanted into Celery tasks.
        from . import tasks  # noqa: F401
