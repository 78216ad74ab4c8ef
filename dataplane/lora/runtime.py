"""The runner's LoRA state: device slots, and the per-step context built from the batch."""

from __future__ import annotations

import torch

from dataplane.config import LoRAConfig
from dataplane.lora.context import LoRAStepContext, build_context
from dataplane.lora.registry import AdapterRegistry
from dataplane.lora.slots import LoRASlots
from dataplane.models.config import LlamaArgs
from kernels import dispatch


class LoRARuntime:
    def __init__(self, registry: AdapterRegistry, config: LoRAConfig, args: LlamaArgs, dtype: torch.dtype,
                 device: torch.device, use_kernels: bool | None = None) -> None:
        if use_kernels is None:
            use_kernels = dispatch.use_triton(device)
        self.registry = registry
        self.use_kernels = use_kernels
        # The CPU path keeps the slots in float32: its small batched matmuls run 1.5-3x faster in
        # float32 than in bf16 (measured: docs/lora.md), which outweighs the doubled bytes.
        slot_dtype = dtype if use_kernels else torch.float32
        self.slots = LoRASlots(args, config.max_loras, config.max_lora_rank, slot_dtype, device,
                               kernel_layout=use_kernels)

    def prepare(self, rows: list[tuple[str | None, int]], num_decodes: int) -> LoRAStepContext | None:
        """rows: (adapter key or None, tokens) per request in batch order. None when no row has an adapter."""
        adapters = self._resident([key for key, _ in rows])
        if not adapters:
            return None
        slot_of = self.slots.assign(adapters)
        groups = frozenset().union(*(a.groups for a in adapters))
        rank = max(a.rank for a in adapters)
        return build_context(self.slots, [(None if k is None else slot_of[k], n) for k, n in rows], num_decodes,
                             rank, groups, self.use_kernels)

    def assign_rows(self, keys: list[str | None]) -> list[int] | None:
        """Each row's slot (-1: the base model), the adapters copied into slots as `prepare` does; None
        when no row has an adapter (decode graphs read the slots from a buffer)."""
        adapters = self._resident(keys)
        if not adapters:
            return None
        slot_of = self.slots.assign(adapters)
        return [-1 if key is None else slot_of[key] for key in keys]

    def _resident(self, keys: list[str | None]) -> list:
        """The registered adapters these keys name (each once, sorted); a key no longer loaded is a bug."""
        adapters = []
        for key in sorted({key for key in keys if key is not None}):
            adapter = self.registry.by_key(key)
            if adapter is None:
                raise RuntimeError(f"adapter {key!r} is scheduled but no longer loaded")
            adapters.append(adapter)
        return adapters

    def forget(self, key: str) -> None:
        self.slots.release(key)
