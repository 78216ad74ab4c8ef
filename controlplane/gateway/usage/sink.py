"""The usage sink: the one pluggable seam between the gateway's meter and a ledger.

`settings.TESSERA_USAGE_SINK` names a callable taking `event=UsageEvent` and idempotent on its request id:
by default `billing.services.usage_record_ingest`, the ledger; a deployment may put its own there (a
different ledger, a forwarder), and tests put a collector. A plain function is called on the usage writer's
thread, inside the transaction that also writes the journal's rows; a coroutine function is awaited on the
request's loop. Everything else the gateway needs of billing (prices, a tenant's spend) is fixed, and is a
plain import of `billing.selectors`.

A name that does not import is refused when the gateway app starts (`check_usage_sink`, run from
`GatewayConfig.ready` and `manage.py check`), so no request is served whose usage would have nowhere to go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string


def usage_sink() -> Callable[..., object]:
    """The configured sink (raises ImportError for a name that does not import). Resolved at each call, a
    dictionary lookup once imported: the setting, or the attribute it names, may be switched (tests do)."""
    return import_string(settings.TESSERA_USAGE_SINK)


def is_async(sink: Callable[..., object]) -> bool:
    return asyncio.iscoroutinefunction(sink)


def check_usage_sink(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    try:
        sink = usage_sink()
    except ImportError as exc:
        return [checks.Critical(f"TESSERA_USAGE_SINK={settings.TESSERA_USAGE_SINK!r} does not import: {exc}",
                                hint="name a callable sink(event=UsageEvent), e.g. billing.services.usage_record_ingest",
                                id="gateway.E001")]
    if not callable(sink):
        return [checks.Critical(f"TESSERA_USAGE_SINK={settings.TESSERA_USAGE_SINK!r} is not callable",
                                id="gateway.E002")]
    return []
