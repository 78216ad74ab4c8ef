from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "controlplane.audit"
    label = "audit"
    verbose_name = "Audit log"

    def ready(self) -> None:
        from . import doors, signals

        doors.install_command_hook()
        doors.install_task_hooks()
        signals.connect()
