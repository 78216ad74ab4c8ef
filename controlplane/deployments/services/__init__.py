"""Writes (HackSoft style: keyword-only `<entity>_<action>`, atomic, messages sent on commit)."""

from .registry import (
    adapter_create,
    adapter_delete,
    deployment_apply,
    deployment_create,
    deployment_delete,
    deployment_update,
    model_create,
    model_delete,
    model_update,
    quantization_normalize,
    replica_retry,
)
from .reports import (
    adapter_refresh_status,
    placement_report,
    replica_fail,
    replica_mark_ready,
    replica_report,
)
from .workers import (
    worker_cordon,
    worker_heartbeat,
    worker_mark_dead,
    worker_register,
    worker_release,
    worker_report,
)

__all__ = [
    "adapter_create", "adapter_delete", "adapter_refresh_status", "deployment_apply", "deployment_create",
    "deployment_delete", "deployment_update", "model_create", "model_delete", "model_update", "placement_report",
    "quantization_normalize", "replica_fail", "replica_mark_ready", "replica_report", "replica_retry",
    "worker_cordon", "worker_heartbeat", "worker_mark_dead", "worker_register", "worker_release", "worker_report",
]
