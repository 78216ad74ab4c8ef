from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "controlplane.gateway"
    label = "gateway"
    verbose_name = "Gateway"

    def ready(self) -> None:
        # Every process reports its host's spool and the usage journal on the shared /metrics registry.
        from controlplane.gateway.routing.shared_prefixes import LOCAL_ONLY, SHARED_UP
        from controlplane.gateway.usage import spool_metrics  # noqa: F401 (registers the spool's gauges and counters)
        from controlplane.gateway.usage.journal_metrics import JOURNAL_COLLECTOR
        from controlplane.slo.metrics import REGISTRY

        REGISTRY.register(JOURNAL_COLLECTOR)
        REGISTRY.register(SHARED_UP)
        REGISTRY.register(LOCAL_ONLY)
