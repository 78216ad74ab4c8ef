"""A worker's class: what its hour is priced as (billing.models.WorkerClassRate.worker_class)."""

from __future__ import annotations

# The label an operator sets on a worker (`--label worker_class=h100-llama70b`) to price it apart from
# its accelerator: the class's speeds are per model, so two models on one accelerator are two classes.
CLASS_LABEL = "worker_class"
UNKNOWN_CLASS = "unknown"


def worker_class_of(*, labels: dict | None, accelerator: str) -> str:
    """The `worker_class` label, else the accelerator kind, else "unknown" (which no rate names by default)."""
    label = (labels or {}).get(CLASS_LABEL)
    if isinstance(label, str) and label.strip():
        return label.strip()[:128]
    return accelerator.strip()[:128] or UNKNOWN_CLASS
