from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "controlplane.gateway"
    label = "gateway"
    verbose_name = "Gateway"

    def ready(self) -> None:
        # Every process reports its host's spool and the usage journal on the shared /metrics registry.
        from controlplane.slo.metrics import REGISTRY

        from . import spool_metrics  # noqa: F401 (registers the spool's gauges and counters)
        from .journal_metrics import JOURNAL_COLLECTOR
        from .shared_prefixes import LOCAL_ONLY, SHARED_UP

        REGISTRY.register(JOURNAL_COLLECTOR)
        REGISTRY.register(SHARED_UP)
        REGISTRY.register(LOCAL_ONLY)
