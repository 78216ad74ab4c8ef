import json

from django.core.management.base import BaseCommand, CommandError

from common.client_ip import normalize
from controlplane.doors import lockout


class Command(BaseCommand):
    help = ("Clear the sign-in lockout of a username and/or a client address (their remembered failures). "
            "The admin shows the same rows under Axes > Access attempts, where deleting them unlocks too.")

    def add_arguments(self, parser):
        parser.add_argument("--username", help="the username as typed at sign-in")
        parser.add_argument("--ip", help="the client address (as /metrics and the log lines show it)")

    def handle(self, *args, username=None, ip=None, **options):
        if not username and not ip:
            raise CommandError("give --username and/or --ip")
        address = None
        if ip:
            address = lockout.address_key(normalize(ip))  # the key it is counted under (an IPv6 /64)
            if address is None:
                raise CommandError(f"invalid_value: {ip!r} is not an IP address")
        rows = lockout.unlock(username=username, ip_address=address)
        self.stdout.write(json.dumps({"username": username, "ip": address, "cleared_rows": rows}))
