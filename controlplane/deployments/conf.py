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
| TESSERA_AUTOSCALE_* | see AUTOSCALE below | the autoscaler's thresholds and clocks (autoscale/policy.py, docs/deployments.md) |
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
# The autoscaler (autoscale/policy.py reads them through Policy.from_settings; docs/deployments.md).
AUTOSCALE: dict[str, float] = {
    "TESSERA_AUTOSCALE_TARGET_WAITING": 4,  # waiting requests per replica above which it grows
    "TESSERA_AUTOSCALE_LOW_WAITING": 0.5,  # ... and below which it may shrink (the band between holds)
    "TESSERA_AUTOSCALE_KV_HIGH": 0.85,  # a replica's KV-cache use above which it grows
    "TESSERA_AUTOSCALE_KV_LOW": 0.5,  # projected use on one replica fewer below which it may shrink
    "TESSERA_AUTOSCALE_BURN_HIGH": 14.4,  # 5-minute latency burn rate (the fast-burn page's factor)
    "TESSERA_AUTOSCALE_BURN_LOW": 1.0,  # on budget: shrinking allowed
    "TESSERA_AUTOSCALE_BURN_MIN_EVENTS": 20,  # fewer requests in 5 minutes: no burn-rate signal
    "TESSERA_AUTOSCALE_UP_COOLDOWN_SECONDS": 30,
    "TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS": 300,  # after any change, before a scale-down
    "TESSERA_AUTOSCALE_DOWN_STABLE_SECONDS": 300,  # every signal low this long before a scale-down
    "TESSERA_AUTOSCALE_IDLE_SECONDS": 900,  # no request this long before the last replica goes (min 0)
    "TESSERA_AUTOSCALE_DRAIN_SECONDS": 120,  # a draining replica is unloaded after this even if busy
    "TESSERA_AUTOSCALE_COLD_START_RETRY_SECONDS": 15,  # Retry-After while a scaled-to-zero model loads
}
DEFAULTS.update(AUTOSCALE)
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
