from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


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
        # Usage with nowhere to go is refused at start-up, in every process that could write it (the
        # gateway, Celery, the management commands), not found at the first request's end.
        from controlplane.gateway.usage.sink import check_usage_sink

        checks.register(check_usage_sink)
        if problems := check_usage_sink():
            raise ImproperlyConfigured(problems[0].msg)
