from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from controlplane.gateway.usage import usage_queue
from controlplane.gateway.usage.sink import usage_sink


class Command(BaseCommand):
    help = "Write queued usage events (TESSERA_USAGE_QUEUE=redis) to the ledger, in batches, until stopped."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="default", help="consumer name (one process per name)")
        parser.add_argument("--batch", type=int, default=200)
        parser.add_argument("--once", action="store_true", help="stop when the queue is empty")

    def handle(self, *args, name, batch, once, **options):
        if not settings.REDIS_URL:
            raise CommandError("usage_consume needs REDIS_URL")
        done = usage_queue.consume(sink=usage_sink(), name=name, batch=batch, once=once)
        self.stdout.write(f"ingested {done} usage events")
