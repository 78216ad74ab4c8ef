"""Imports point down the house's layers (docs/ARCHITECTURE.md), never up.

The graph is tests/test_import_cycles.py's (read from the source with `ast`; lazy and TYPE_CHECKING imports
count). Each project module belongs to one layer, by its longest matching prefix in LAYERS; an import from a
module to one in a higher layer is a violation, as is any import across the planes' process boundary (the
data plane and the control plane talk over HTTP and Celery only). ALLOWED holds the violations known when
the test was written, each with the reason it stays; a new one fails, and so does an entry that no longer
exists, so the list only shrinks.
"""

from __future__ import annotations

from tests.test_import_cycles import import_graph

# Lowest first. Same-layer imports are free; `benchmarks` sits above everything and may import anything.
LAYERS: list[tuple[str, ...]] = [
    ("jsonlog", "fsbroker", "kernels"),
    # plain data and settings every layer of the data plane reads
    ("dataplane.config", "dataplane.cpu_features", "dataplane.sampling_params", "dataplane.request", "dataplane.errors",
     "dataplane.outputs", "dataplane.stats", "dataplane.spec_decode.config", "dataplane.structured.params",
     "dataplane.scheduler.output"),  # the dataclasses that are the scheduler's contract with the runner
    ("dataplane.models", "dataplane.quant", "dataplane.lora", "dataplane.distributed"),
    ("dataplane.runner", "dataplane.sampling", "dataplane.structured", "dataplane.spec_decode"),
    ("dataplane.engine", "dataplane.scheduler", "dataplane.kv_cache", "dataplane",
     "dataplane.distributed.follower"),  # a rank's process: its loop runs the runner's decode graphs
    ("dataplane.quantize",),  # the tools that make and gate quantized checkpoints: the gate runs the engine
    ("dataplane.worker",),
    # the control plane's ground floor: errors, async ORM calls, client address, renderers; and the audit
    # log's writer and models, which every app's services call (its API, export command and the role
    # listener, which knows the tenants' role names, stand higher)
    ("common", "controlplane.audit"),
    ("tenants", "billing"),
    ("controlplane", "controlplane.audit.api", "controlplane.audit.management", "controlplane.audit.signals",
     "controlplane.audit.apps"),  # the app's wiring: ready() connects the role listener
    ("benchmarks",),
]
DATA_PLANE = ("dataplane", "kernels")
CONTROL_PLANE = ("common", "controlplane", "tenants", "billing")

# (importer, imported): the exceptions of today, and why each stays for now.
ALLOWED: set[tuple[str, str]] = {
    # `make run`'s launcher finds the model file the worker it starts will load (a path, no engine code)
    ("controlplane.localstack", "dataplane.models.registry"),
    # a tenant's admin page shows its SLO status and the platform's (an admin panel composing two apps);
    # the key-guessing throttle counts its refusals on the SLO registry that /metrics serves
    ("tenants.admin_panels", "controlplane.slo.selectors"),
    ("tenants.admin_panels", "controlplane.slo.sli"),
    ("tenants.auth_throttle", "controlplane.slo.metrics"),
    # the cost side of unit economics reads the replicas' lifetimes from the deployments app
    ("billing.services.replica_spans", "controlplane.deployments.models"),
}


def _prefixes(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def layer_of(module: str) -> int:
    for prefix in _prefixes(module):
        for i, layer in enumerate(LAYERS):
            if prefix in layer:
                return i
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS")


def _plane(module: str) -> str | None:
    top = module.split(".")[0]
    return "data" if top in DATA_PLANE else "control" if top in CONTROL_PLANE else None


def violations() -> set[tuple[str, str]]:
    graph = import_graph()
    found = set()
    for a, targets in graph.items():
        for b in targets:
            planes = {_plane(a), _plane(b)}
            if layer_of(b) > layer_of(a) or planes == {"data", "control"}:
                found.add((a, b))
    return found


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_imports_point_down_the_layers():
    found = violations()
    new = sorted(found - ALLOWED)
    stale = sorted(ALLOWED - found)
    assert not new, "imports pointing up a layer (or across the planes):\n  " + "\n  ".join(f"{a} -> {b}" for a, b in new)
    assert not stale, "no longer happen; remove from ALLOWED:\n  " + "\n  ".join(f"{a} -> {b}" for a, b in stale)
