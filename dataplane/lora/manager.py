"""The engine's LoRA side: parse (any thread), register and remove (engine thread), resolve, report.

Requests carry an adapter *key* (`name#uid`, unique per registration), never the bare name: the
prefix cache hashes it, so re-adding a name with new weights cannot meet the old weights' blocks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dataplane.config import LoRAConfig
from dataplane.lora.adapter import LoRAAdapter, check_name, load_adapter
from dataplane.lora.registry import AdapterRegistry, adapter_name
from dataplane.lora.runtime import LoRARuntime
from dataplane.models.llama import LlamaModel


class AdapterUse(Protocol):
    """What the manager asks of the scheduler, which owns the queues (dataplane/scheduler/scheduler.py): the
    manager stands below it and never reads a queue itself."""

    def adapter_in_use(self, key: str) -> bool: ...

    def adapters_by_queue(self) -> tuple[list[str], list[str]]: ...


@dataclass(slots=True)
class AdapterInfo:
    name: str
    path: str
    rank: int
    target_modules: list[str]
    scaling: dict[str, float]  # per target module
    num_bytes: int  # host copy
    resident: bool  # holds a device slot now


@dataclass(slots=True)
class LoRAStats:
    max_loras: int  # device slots
    loaded: list[str] = field(default_factory=list)  # registered adapter names
    running: dict[str, int] = field(default_factory=dict)  # adapter name -> running requests
    waiting: dict[str, int] = field(default_factory=dict)  # adapter name -> waiting requests
    slot_loads: int = 0  # adapters copied into a device slot, cumulative
    slot_evictions: int = 0  # adapters evicted from a slot to make room, cumulative


class LoRAManager:
    def __init__(self, config: LoRAConfig, model: LlamaModel, scheduler: AdapterUse) -> None:
        self.config = config
        self.args = model.args
        self.dtype = model.dtype
        # q/k rows of the base weights are interleaved on the torch path only (models/loader.py).
        self.use_kernels = bool(getattr(model, "use_kernels", False))
        self.pin_memory = model.device.type == "cuda"
        self.registry = AdapterRegistry(config.max_cpu_loras)  # type: ignore[arg-type]
        self.runtime = LoRARuntime(self.registry, config, model.args, model.dtype, model.device, self.use_kernels)
        self.scheduler = scheduler

    # -- any thread ------------------------------------------------------------------------------
    def load(self, name: str, path: str | Path) -> LoRAAdapter:
        """Read and validate an adapter; touches no engine state, so it runs off the step thread."""
        check_name(name)
        existing = self.registry.get(name)
        if existing is not None and existing.path != str(Path(path).expanduser()):
            raise ValueError(f"adapter: {name!r} is already loaded from {existing.path!r}; "
                             "remove it first to load it from elsewhere")
        return load_adapter(name, path, self.args, max_rank=self.config.max_lora_rank, dtype=self.dtype,
                            interleave_qk=not self.use_kernels, pin_memory=self.pin_memory)

    def resolve(self, name: str | None) -> str | None:
        """A request's adapter name -> the key it carries; ValueError naming `adapter` if unknown."""
        if name is None:
            return None
        if not isinstance(name, str):
            raise ValueError(f"adapter: must be an adapter name or None, got {type(name).__name__}")
        return self.registry.resolve(name).key

    # -- the engine thread ---------------------------------------------------------------------
    def register(self, adapter: LoRAAdapter) -> None:
        for dropped in self.registry.add(adapter, self.in_use):
            self.runtime.forget(dropped.key)

    def remove(self, name: str) -> None:
        adapter = self.registry.remove(name, self.in_use)
        self.runtime.forget(adapter.key)

    def admit(self, key: str | None) -> None:
        """Called as a request joins the queue: the adapter must still be loaded; it becomes most recent."""
        if key is None:
            return
        if self.registry.by_key(key) is None:
            raise ValueError(f"adapter: {adapter_name(key)!r} was removed before the request was queued")
        self.registry.touch(key)

    def in_use(self, key: str) -> bool:
        return self.scheduler.adapter_in_use(key)

    def list(self) -> list[AdapterInfo]:
        slots = self.runtime.slots
        return [AdapterInfo(a.name, a.path, a.rank, list(a.target_modules), dict(a.scaling), a.num_bytes,
                            a.key in slots.index) for a in self.registry.adapters()]

    def stats(self) -> LoRAStats:
        running_keys, waiting_keys = self.scheduler.adapters_by_queue()
        running, waiting = Counter(map(adapter_name, running_keys)), Counter(map(adapter_name, waiting_keys))
        slots = self.runtime.slots
        return LoRAStats(self.config.max_loras, self.registry.names(), dict(running), dict(waiting),
                         slots.num_loads, slots.num_evictions)
