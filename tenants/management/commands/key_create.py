from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from common.errors import ApplicationError
from tenants import selectors, services

from ._output import dump, fail, key_json


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class Command(BaseCommand):
    help = 'Create an API key for a tenant; prints {"api_key": "sk-...", "key": ...} (the key is shown once).'

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--models", help="comma-separated allowed models (default: any)")
        parser.add_argument("--adapters", help="comma-separated allowed adapters (default: any)")
        parser.add_argument("--expires-in-days", type=float)
        parser.add_argument("--manage", action="store_true", help="may also use the management API")

    def handle(self, *args, **o):
        expires = timezone.now() + timedelta(days=o["expires_in_days"]) if o["expires_in_days"] else None
        try:
            created = services.api_key_create(
                tenant=selectors.tenant_get(slug=o["tenant"]), name=o["name"], allowed_models=_csv(o["models"]),
                allowed_adapters=_csv(o["adapters"]), expires_at=expires, can_manage=o["manage"],
            )
        except ApplicationError as exc:
            raise fail(exc) from None
        dump(self, {"api_key": created.secret, "key": key_json(created.key)})
