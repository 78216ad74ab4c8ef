from __future__ import annotations

from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig
from django.core import checks


class DoorsConfig(AppConfig):
    name = "controlplane.doors"
    label = "doors"
    verbose_name = "Sign-in security"

    def ready(self) -> None:
        from axes.signals import user_locked_out
        from django.contrib.auth.signals import user_login_failed

        from . import metrics

        user_login_failed.connect(metrics.on_login_failed, dispatch_uid="doors-login-failed")
        user_locked_out.connect(metrics.on_locked_out, dispatch_uid="doors-locked-out")
        checks.register(check_two_factor_roles, checks.Tags.security)


class DoorsAdminConfig(AdminConfig):
    """django.contrib.admin with TesseraAdminSite as `admin.site` (every @admin.register lands there)."""

    default_site = "controlplane.doors.site.TesseraAdminSite"


def check_two_factor_roles(app_configs=None, **kwargs):
    # lazy: models (tenants.roles) and settings; Django imports apps.py before they can be
    from tenants.roles import ROLES

    from . import conf

    unknown = [role for role in conf.two_factor_roles() if role not in ROLES]
    if unknown:  # a misspelt role would silently require no second factor of anyone
        return [checks.Error(f"TESSERA_ADMIN_2FA_ROLES names unknown roles {unknown}; roles are {list(ROLES)}",
                             id="doors.E001")]
    return []
