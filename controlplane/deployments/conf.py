"""Deployment settings: Django settings first, then the environment, then the default.

| name | default | meaning |
|---|---|---|
| TESSERA_RECONCILE_SECONDS | 5 | beat interval of `deployments.reconcile` |
| TESSERA_WORKER_HEARTBEAT_SECONDS | 2 | how often workers heartbeat (told to them at registration) |
| TESSERA_WORKER_DEAD_SECONDS | 15 | no heartbeat for this long: the worker is dead, its replicas move |
| TESSERA_REPLICA_MAX_ATTEMPTS | 3 | failed loads of one replica before it stays `failed` |
| TESSERA_REPLICA_RETRY_SECONDS | 10 | backoff after the first failure; doubles per failure, at most 300 s |
| TESSERA_REPLICA_LOAD_TIMEOUT_SECONDS | 900 | a load not finished after this counts as failed |
| TESSERA_REPLICA_REDISPATCH_SECONDS | 30 | a load its worker does not report as started is sent again after this |
| TESSERA_MAX_ADAPTERS_PER_TENANT | 8 | adapters one tenant may register (LoRA slots are shared by every tenant) |
| TESSERA_ADAPTER_ROOT | empty: no local sources | the adapter store on the workers; tenant T's sources live under `<root>/<T>/` |
| TESSERA_ADAPTER_SOURCES | empty: no URIs | comma-separated URI prefixes (`s3://bucket[/prefix]`); tenant T's under `<prefix>/<T>/` |
| TESSERA_INTERNAL_TOKEN | empty: loopback only | the bearer token of `/internal/v1/` (workers only; not the gateway's worker token) |
| TESSERA_INTERNAL_ALLOW_FORWARDED | 0 | 1: accept `/internal/v1/` calls that carry X-Forwarded-For (came through a proxy) |
"""

from __future__ import annotations

import os

from django.conf import settings

DEFAULTS: dict[str, float] = {
    "TESSERA_RECONCILE_SECONDS": 5,
    "TESSERA_WORKER_HEARTBEAT_SECONDS": 2,
    "TESSERA_WORKER_DEAD_SECONDS": 15,
    "TESSERA_REPLICA_MAX_ATTEMPTS": 3,
    "TESSERA_REPLICA_RETRY_SECONDS": 10,
    "TESSERA_REPLICA_LOAD_TIMEOUT_SECONDS": 900,
    "TESSERA_REPLICA_REDISPATCH_SECONDS": 30,
    "TESSERA_MAX_ADAPTERS_PER_TENANT": 8,
}
STR_DEFAULTS: dict[str, str] = {"TESSERA_ADAPTER_ROOT": "", "TESSERA_ADAPTER_SOURCES": "", "TESSERA_INTERNAL_TOKEN": "",
                               "TESSERA_INTERNAL_ALLOW_FORWARDED": "0"}
MAX_RETRY_SECONDS = 300
MAX_REDISPATCHES = 3


def get(name: str) -> float:
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name) or DEFAULTS[name]
    return float(value)


def get_str(name: str) -> str:
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name, STR_DEFAULTS[name])
    return str(value)


def retry_delay(failures: int) -> float:
    """Seconds before retrying after `failures` consecutive failures (1, 2, ...)."""
    return min(get("TESSERA_REPLICA_RETRY_SECONDS") * 2 ** max(failures - 1, 0), MAX_RETRY_SECONDS)
