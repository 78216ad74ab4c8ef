from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "controlplane.deployments"
    label = "deployments"
    verbose_name = "Deployments"

    def ready(self) -> None:
        from controlplane.gateway.workers import install_registry

        from . import metrics
        from .autoscale import metrics as autoscaler_metrics
        from .routing import DeploymentRegistry

        metrics.register()
        autoscaler_metrics.register()
        # The gateway owns the registry interface; this app provides the database-backed implementation.
        install_registry(DeploymentRegistry)
