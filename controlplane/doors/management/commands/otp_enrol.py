import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.doors import twofactor


class Command(BaseCommand):
    help = ("Give a user a new TOTP authenticator and recovery codes, replacing any they had (a lost phone), "
            "and print the otpauth:// URI (for the app) and the codes: hand them to the user over a safe channel. "
            "--reset only removes the user's devices (their next sign-in enrols again, where self-enrolment is on).")

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True)
        parser.add_argument("--reset", action="store_true", help="remove the devices instead of issuing new ones")

    def handle(self, *args, username, reset=False, **options):
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"not_found: no user {username!r}")
        if reset:
            removed = twofactor.devices_reset(user)
            self.stdout.write(json.dumps({"username": username, "removed_devices": removed}))
            return
        device, codes = twofactor.otp_enrol(user)
        self.stdout.write(json.dumps({"username": username, "otpauth_uri": device.config_url, "recovery_codes": codes}))
