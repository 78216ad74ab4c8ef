"""Device slots: `max_loras` adapters stacked per layer and fused projection, least recently used evicted.

Per fused projection g (qkv, o, gate_up, down) with n sub-projections, one tensor over all
layers and slots holds A and one holds B. A is rank-major then sub-projection:

    A row/column j * n + k  =  rank j of sub-projection k

so the first `rank * n` rows are every sub-projection's ranks below `rank`, and a step whose
adapters have rank <= r computes on a contiguous slice instead of the full `max_lora_rank`.

Layouts:
- Triton kernels: A [slots, R*n, in] and B [slots, out, R*n] (unit stride in the last
  dimension). B is block-structured: sub-projection k's columns are non-zero only in its rows
  of the fused output, so one expand covers q, k and v (or gate and up) together.
- CPU: A^T [slots, in, R*n] and a compact B^T [slots, R, out]: row j holds rank j of every
  sub-projection, each in its own columns. The CPU path expands each sub-projection on its
  column slice, so it neither stores nor multiplies the zeros of the block structure (which were
  half of gate_up's bytes and two thirds of qkv's). CPU slots are float32 (see runtime.py).

Buffers of a fused projection are allocated when the first adapter that targets it is loaded:
attention-only adapters cost no MLP memory and no MLP compute.
"""

from __future__ import annotations

import logging

import torch

from dataplane.lora.adapter import GROUPS, GroupShape, LoRAAdapter, group_shapes
from dataplane.models.config import LlamaArgs

log = logging.getLogger(__name__)


class LoRASlots:
    def __init__(self, args: LlamaArgs, num_slots: int, max_rank: int, dtype: torch.dtype, device: torch.device,
                 kernel_layout: bool) -> None:
        self.num_layers = args.num_layers
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.kernel_layout = kernel_layout
        self.shapes: dict[str, GroupShape] = group_shapes(args)
        self.a: dict[str, torch.Tensor] = {}  # group -> [layers, slots, R*n, in] or [layers, slots, in, R*n]
        self.b: dict[str, torch.Tensor] = {}  # group -> [layers, slots, out, R*n] or [layers, slots, R, out]
        self.keys: list[str | None] = [None] * num_slots  # adapter key held by each slot
        self.adapters: list[LoRAAdapter | None] = [None] * num_slots
        self.last_used = [0] * num_slots
        self.index: dict[str, int] = {}  # adapter key -> slot
        self._views: dict[tuple[str, int, int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._clock = 0
        self.num_loads = 0
        self.num_evictions = 0

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.b.values()))

    def views(self, group: str, lo: int, hi: int, rank: int) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        """Per layer, (A, B) of slots lo..hi-1 cut to `rank`; cached, since slicing per layer and
        projection every step is a few hundred dispatcher calls (the buffers never move).

        Kernel layout: B is one tensor. CPU layout: B is one [slots, rank, out_k] column slice per
        sub-projection."""
        key = (group, lo, hi, rank)
        views = self._views.get(key)
        if views is None:
            rn = rank * len(GROUPS[group])
            a, b = self.a[group], self.b[group]
            if self.kernel_layout:
                views = [(a[i, lo:hi, :rn], b[i, lo:hi, :, :rn]) for i in range(self.num_layers)]
            else:
                views = [(a[i, lo:hi, :, :rn], self.sub_columns(group, b[i, lo:hi, :rank]))
                         for i in range(self.num_layers)]
            self._views[key] = views
        return views

    def sub_columns(self, group: str, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A CPU-layout B [..., rank, out] split into each sub-projection's columns (views)."""
        shape = self.shapes[group]
        return tuple(b[..., shape.out_offset(k) : shape.out_offset(k) + n] for k, n in enumerate(shape.out_features))

    def assign(self, adapters: list[LoRAAdapter]) -> dict[str, int]:
        """Slots for this step's adapters (at most num_slots distinct), copying in those not resident."""
        if len(adapters) > self.num_slots:
            raise RuntimeError(f"{len(adapters)} adapters in one step but only max_loras={self.num_slots} slots "
                               "(the scheduler should have prevented this)")
        self._clock += 1
        wanted = {a.key for a in adapters}
        out: dict[str, int] = {}
        for adapter in adapters:
            slot = self.index.get(adapter.key)
            if slot is None:
                slot = self._free_slot(wanted)
                self._load(slot, adapter)
            self.last_used[slot] = self._clock
            out[adapter.key] = slot
        return out

    def release(self, key: str) -> None:
        """Forget an adapter that was removed from the registry (its slot becomes free)."""
        slot = self.index.pop(key, None)
        if slot is not None:
            self.keys[slot] = None
            self.adapters[slot] = None

    def _free_slot(self, wanted: set[str]) -> int:
        # The lowest free slot first: adapters in use then cluster at low indices, and the CPU path
        # can use a slice of the slot buffers instead of gathering them.
        for slot, key in enumerate(self.keys):
            if key is None:
                return slot
        victims = [s for s, key in enumerate(self.keys) if key not in wanted]
        slot = min(victims, key=lambda s: self.last_used[s])
        log.debug("lora_slot_evicted", extra={"adapter": self.keys[slot], "slot": slot})
        self.release(self.keys[slot])  # type: ignore[arg-type]
        self.num_evictions += 1
        return slot

    def _load(self, slot: int, adapter: LoRAAdapter) -> None:
        if adapter.rank > self.max_rank:
            raise ValueError(f"adapter {adapter.name!r}: rank {adapter.rank} exceeds max_lora_rank={self.max_rank}")
        for group in adapter.groups:
            if group not in self.a:
                self._allocate(group)
        for group in self.a:
            self.a[group][:, slot].zero_()
            self.b[group][:, slot].zero_()
        for layer, per_group in enumerate(adapter.layers):
            for group, subs in per_group.items():
                self._copy(group, layer, slot, subs)
        self.keys[slot] = adapter.key
        self.adapters[slot] = adapter
        self.index[adapter.key] = slot
        self.num_loads += 1

    def _copy(self, group: str, layer: int, slot: int, subs: list) -> None:
        shape = self.shapes[group]
        n, big_r = len(GROUPS[group]), self.max_rank
        a, b = self.a[group][layer, slot], self.b[group][layer, slot]
        for s in subs:
            r = s.a.shape[0]
            rows = slice(shape.out_offset(s.sub), shape.out_offset(s.sub) + shape.out_features[s.sub])
            sa, sb = s.a.to(self.device, non_blocking=True), s.b.to(self.device, non_blocking=True)
            if self.kernel_layout:
                a.view(big_r, n, shape.in_features)[:r, s.sub] = sa
                b[rows].view(-1, big_r, n)[:, :r, s.sub] = sb
            else:
                a.view(shape.in_features, big_r, n)[:, :r, s.sub] = sa.t()
                b[:r, rows] = sb.t()

    def allocate_all(self) -> None:
        """Every group's buffers now: a captured CUDA graph holds their addresses, so no adapter load may
        allocate them later (the buffers of groups no adapter targets stay zeros)."""
        for group in self.shapes:
            if group not in self.a:
                self._allocate(group)

    def _allocate(self, group: str) -> None:
        shape = self.shapes[group]
        rn = self.max_rank * len(GROUPS[group])
        lead = (self.num_layers, self.num_slots)
        a_shape = (*lead, rn, shape.in_features) if self.kernel_layout else (*lead, shape.in_features, rn)
        b_shape = (*lead, shape.out_total, rn) if self.kernel_layout else (*lead, self.max_rank, shape.out_total)
        self.a[group] = torch.zeros(a_shape, dtype=self.dtype, device=self.device)
        self.b[group] = torch.zeros(b_shape, dtype=self.dtype, device=self.device)
        log.info("lora_buffers_allocated", extra={"group": group, "mib": round(self.num_bytes / 2**20, 1)})
