from django.core.management.base import BaseCommand

from common.errors import ApplicationError
from tenants import selectors, services

from ._output import dump, fail, key_json, tenant_json


class Command(BaseCommand):
    help = 'Create a tenant and its first key; prints {"tenant": ..., "api_key": "sk-..."} (the key is shown once).'

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--tier", required=True, help="free, standard, premium, enterprise, ...")
        parser.add_argument("--slug", help="defaults to the slugified name")

    def handle(self, *args, name, tier, slug=None, **options):
        try:
            tenant, created = services.tenant_create_with_key(name=name, tier=selectors.tier_get(name=tier), slug=slug)
        except ApplicationError as exc:
            raise fail(exc) from None
        dump(self, {"tenant": tenant_json(tenant), "api_key": created.secret, "key": key_json(created.key)})
