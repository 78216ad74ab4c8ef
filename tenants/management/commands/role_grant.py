from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenants.roles import ROLES, role_grant, user_has_role

from ._output import dump


class Command(BaseCommand):
    help = (
        "Give a Django user a role (operator: everything; finance: read billing, usage and exports). "
        "Granting makes the user staff so they can log in to the admin. --revoke takes the role away."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--revoke", action="store_true", help="take the role away instead")

    def handle(self, *args, user, role, revoke=False, **options):
        User = get_user_model()
        try:
            obj = User.objects.get(**{User.USERNAME_FIELD: user})
        except User.DoesNotExist:
            raise CommandError(f"not_found: no user {user!r} (create one: manage.py createsuperuser or the admin)") from None
        role_grant(user=obj, role=role, revoke=revoke)
        obj = User.objects.get(pk=obj.pk)  # fresh permission cache
        dump(self, {
            "user": getattr(obj, User.USERNAME_FIELD),
            "is_staff": obj.is_staff,
            "is_superuser": obj.is_superuser,
            "roles": [name for name in ROLES if user_has_role(obj, name)],
        })
