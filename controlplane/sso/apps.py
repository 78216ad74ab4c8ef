from django.apps import AppConfig
from django.core import checks


class SSOConfig(AppConfig):
    name = "controlplane.sso"
    label = "sso"
    verbose_name = "Single sign-on"

    def ready(self) -> None:
        from controlplane.sso.config import settings_errors

        @checks.register(checks.Tags.security)
        def sso_settings(app_configs, **kwargs):
            return [checks.Error(message, id="sso.E001") for message in settings_errors()]
