import asyncio

from django.core.management.base import BaseCommand

from controlplane.gateway import upstream
from controlplane.gateway.usage import sweeper


class Command(BaseCommand):
    help = ("Finish the accounting of requests whose gateway died: ask their workers for the final counts, "
            "bill them, settle the limiter (beat runs this every minute as gateway.usage_sweep).")

    def add_arguments(self, parser):
        parser.add_argument("--min-age", type=float, default=None, help="seconds a journal row must be old (default: setting)")
        parser.add_argument("--give-up-after", type=float, default=None,
                            help="seconds after which a request no worker knows is billed at its reservation")

    def handle(self, *args, min_age, give_up_after, **options):
        async def run():
            try:
                return await sweeper.sweep(min_age=min_age, give_up_after=give_up_after)
            finally:
                await upstream.close()

        report = asyncio.run(run())
        self.stdout.write(" ".join(f"{k}={v}" for k, v in report.as_dict().items()))
