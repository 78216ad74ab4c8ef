"""Host-resident adapters by name, least recently used first, bounded by `max_cpu_loras`.

Mutated only on the engine's thread (the offline LLM's caller, or AsyncLLM's step thread);
other threads may read a name's entry (a single dict lookup is atomic under the GIL).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

from dataplane.lora.adapter import LoRAAdapter

log = logging.getLogger(__name__)


def adapter_name(key: str) -> str:
    """The registered name inside a request's adapter key (`name#uid`; names cannot contain '#')."""
    return key.rsplit("#", 1)[0]


class AdapterRegistry:
    def __init__(self, max_cpu_loras: int) -> None:
        self.max_cpu_loras = max_cpu_loras
        self._by_name: OrderedDict[str, LoRAAdapter] = OrderedDict()  # least recently used first
        self._by_key: dict[str, LoRAAdapter] = {}
        self.num_dropped = 0  # adapters dropped to respect max_cpu_loras

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return list(self._by_name)

    def adapters(self) -> list[LoRAAdapter]:
        return list(self._by_name.values())

    def get(self, name: str) -> LoRAAdapter | None:
        return self._by_name.get(name)

    def by_key(self, key: str) -> LoRAAdapter | None:
        return self._by_key.get(key)

    def resolve(self, name: str) -> LoRAAdapter:
        """The adapter a request names; ValueError naming `adapter` when there is none."""
        adapter = self._by_name.get(name)
        if adapter is None:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise ValueError(f"adapter: unknown adapter {name!r} (loaded: {known})")
        return adapter

    def touch(self, key: str) -> None:
        adapter = self._by_key.get(key)
        if adapter is not None and adapter.name in self._by_name:
            self._by_name.move_to_end(adapter.name)

    def add(self, adapter: LoRAAdapter, in_use: Callable[[str], bool]) -> list[LoRAAdapter]:
        """Register; drop least recently used idle adapters beyond max_cpu_loras, and return them."""
        existing = self._by_name.get(adapter.name)
        if existing is not None:
            if existing.path == adapter.path:
                self._by_name.move_to_end(adapter.name)
                return []  # loading the same name from the same place again is a no-op (retried tasks)
            raise ValueError(f"adapter: {adapter.name!r} is already loaded from {existing.path!r}; "
                             "remove it first to load it from elsewhere")
        dropped: list[LoRAAdapter] = []
        while len(self._by_name) + 1 > self.max_cpu_loras:
            victim = next((a for a in self._by_name.values() if not in_use(a.key)), None)
            if victim is None:
                raise ValueError(f"adapter: max_cpu_loras={self.max_cpu_loras} adapters are loaded and all "
                                 "are in use by requests; retry when one is idle, or remove one")
            self._drop(victim)
            dropped.append(victim)
            self.num_dropped += 1
            log.info("lora_adapter_dropped", extra={"adapter": victim.name, "reason": "max_cpu_loras"})
        self._by_name[adapter.name] = adapter
        self._by_key[adapter.key] = adapter
        return dropped

    def remove(self, name: str, in_use: Callable[[str], bool]) -> LoRAAdapter:
        adapter = self.resolve(name)
        if in_use(adapter.key):
            raise ValueError(f"adapter: {name!r} is in use by running or waiting requests; "
                             "remove it once they finish (or abort them)")
        self._drop(adapter)
        return adapter

    def _drop(self, adapter: LoRAAdapter) -> None:
        del self._by_name[adapter.name]
        del self._by_key[adapter.key]
