from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from controlplane.gateway.usage import spool


class Command(BaseCommand):
    help = ("Replay into the ledger, and remove, the usage spool files that no live gateway process holds "
            "(a gateway that died while the database was away; its host's gateways also do this by "
            "themselves every 30 s). Files of live processes are theirs to replay and are left alone.")

    def add_arguments(self, parser):
        parser.add_argument("--dir", default=None, help="the spool directory (default: TESSERA_USAGE_SPOOL_DIR)")

    def handle(self, *args, dir, **options):
        directory = Path(dir) if dir else Path(settings.TESSERA_USAGE_SPOOL_DIR)
        if not directory.is_dir():
            raise CommandError(f"{directory} is not a directory")
        before = spool.directory_state(directory)
        applied = spool.replay_abandoned(directory)
        after = spool.directory_state(directory)
        self.stdout.write(f"replayed={applied} files_left={int(after['files'])} bytes_left={int(after['bytes'])} "
                          f"files_before={int(before['files'])}")
