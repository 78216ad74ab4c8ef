from django.core.management.base import BaseCommand

from common.errors import ApplicationError
from tenants import selectors, services

from ._output import dump, fail, tenant_json


class Command(BaseCommand):
    help = "Suspend a tenant (every key is refused), or re-activate it with --activate."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--activate", action="store_true", help="re-activate instead")

    def handle(self, *args, tenant, activate=False, **options):
        try:
            obj = selectors.tenant_get(slug=tenant)
            obj = services.tenant_activate(tenant=obj) if activate else services.tenant_suspend(tenant=obj)
        except ApplicationError as exc:
            raise fail(exc) from None
        dump(self, {"tenant": tenant_json(obj)})
