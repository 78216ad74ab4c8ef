from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "controlplane.deployments"
    label = "deployments"
    verbose_name = "Deployments"

    def ready(self) -> None:
        from controlplane.gateway.routing.workers import install_registry

        from . import metrics
        from .routing import DeploymentRegistry

        metrics.register()  # the reconciler's and the autoscaler's series
        # The gateway owns the registry interface; this app provides the database-backed implementation.
        install_registry(DeploymentRegistry)
