"""`python manage.py worker_release <name> [--reason TEXT]`: end a worker's registration.

A worker's name is bound to the boot id that registered it (docs/deployments.md, "The internal
API"); another process may take the name only once that registration is gone. This releases it
now (the worker is marked dead, its replicas move), for an operator without the admin.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from common.errors import ApplicationError
from controlplane.deployments import selectors, services


class Command(BaseCommand):
    help = "Release a worker's registration so that another process may register under its name."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the worker's name (its id)")
        parser.add_argument("--reason", default="released by an operator (manage.py worker_release)")

    def handle(self, *args, name: str, reason: str, **options):
        try:
            worker = services.worker_release(worker=selectors.worker_get(name=name), reason=reason)
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"released {worker.name}: the next registration under this name is accepted")
