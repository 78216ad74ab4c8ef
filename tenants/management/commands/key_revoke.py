from django.core.management.base import BaseCommand, CommandError

from common.errors import ApplicationError
from tenants import services
from tenants.models import APIKey

from ._output import dump, fail, key_json


class Command(BaseCommand):
    help = "Revoke an API key now, by id or by its visible prefix (sk-xxxxxxxx)."

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=int)
        which.add_argument("--prefix")

    def handle(self, *args, id=None, prefix=None, **options):
        keys = APIKey.objects.select_related("tenant")
        matches = list(keys.filter(pk=id) if id is not None else keys.filter(prefix=prefix)[:2])
        if len(matches) != 1:
            raise CommandError("No such key." if not matches else "That prefix matches several keys; use --id.")
        key = matches[0]
        try:
            key = services.api_key_revoke(tenant=key.tenant, key=key)
        except ApplicationError as exc:
            raise fail(exc) from None
        dump(self, {"key": key_json(key)})
