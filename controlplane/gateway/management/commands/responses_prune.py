"""Delete stored Responses API answers past TESSERA_RESPONSES_RETENTION_DAYS (beat runs the same hourly)."""

from django.core.management.base import BaseCommand

from controlplane.gateway.responses.responses_store import stored_responses_prune


class Command(BaseCommand):
    help = "Delete stored /v1/responses answers older than TESSERA_RESPONSES_RETENTION_DAYS."

    def handle(self, *args, **options) -> None:
        self.stdout.write(f"deleted {stored_responses_prune()} stored responses")
