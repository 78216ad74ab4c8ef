"""Per-step LoRA metadata, built once by the runner and passed explicitly to the model's forward.

`LoRAStepContext.apply(layer, group, x, y)` adds every token's adapter delta to a fused
projection's output in place, for all adapters of the batch at once:

- CPU: a gathered batched matmul. Tokens are gathered into [groups, C, in], one group per slot
  (rows padded to the largest group, pads zeroed by `keep`), `bmm` with the slots' A^T (one
  shrink for all sub-projections) and each sub-projection's B^T (one expand each, concatenated),
  and the deltas gathered back into token order (base-model tokens read a zeroed pad row) and
  added. A handful of ops per projection whatever the number of adapters, and the arithmetic is
  each token's own rank-r product, not every adapter's. In float32: these small batched matmuls
  run faster in float32 than in bf16 here. The way back is a gather, not `index_add_`:
  in bf16 `index_add_` runs as a serial scatter_add that took 42% of a mixed decode step
  (32 tokens, 8 adapters), more than the base model's matmuls.
- CUDA: the Triton kernels from kernels/ (BGMV for the decode rows, SGMV for prefill chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.lora.adapter import GROUPS
from dataplane.lora.slots import LoRASlots
from kernels import dispatch

# A batch's groups are padded to the largest; past this ratio of padded to real rows, the CPU path
# splits groups into equal chunks and gathers each chunk's slot weights instead (one prefill chunk
# of 400 tokens beside 7 single decodes would otherwise compute 8 x 400 rows).
MAX_PAD_RATIO = 2.0


@dataclass(slots=True)
class LoRAStepContext:
    slots: LoRASlots
    groups: frozenset[str]  # fused projections that get a delta this step
    rank: int  # ranks computed per sub-projection: the largest rank among this step's adapters
    # CPU path
    rows: torch.Tensor | None = None  # [G * C] long, the token row at each gathered position
    inverse: torch.Tensor | None = None  # [T] long, each token's gathered position (a pad row if none)
    keep: torch.Tensor | None = None  # [G, C, 1] model dtype, 1 for real rows and 0 for pads (None: no
    # base-model token reads a pad row this step, so pads need not be zeroed)
    width: int = 0  # C, rows per group
    slot_range: tuple[int, int] | None = None  # group g uses slot lo + g ...
    slot_ids: torch.Tensor | None = None  # ... or slot_ids[g] (long), when groups were split
    # CUDA path
    num_decodes: int = 0  # leading one-token rows (BGMV)
    token_slots: torch.Tensor | None = None  # int32 [num_decodes], -1 for the base model
    seg_indptr: torch.Tensor | None = None  # int32 [segments + 1], rows after the decodes (SGMV)
    seg_slots: torch.Tensor | None = None  # int32 [segments], -1 for the base model
    max_seg_len: int = 0
    scaling: torch.Tensor | None = None  # float32 ones [slots]: scaling is folded into B at load

    def apply(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y [T, out] += delta(x [T, in]) for every token with an adapter; in place."""
        if group not in self.groups:
            return
        if self.rows is not None:
            self._apply_gathered(layer, group, x, y)
        else:
            self._apply_kernels(layer, group, x, y)

    def _apply_gathered(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        n = len(GROUPS[group])
        if self.slot_range is not None:
            a, bs = self.slots.views(group, *self.slot_range, self.rank)[layer]  # [G, in, rn], n x [G, r, out_k]
        else:
            a = self.slots.a[group][layer].index_select(0, self.slot_ids)[:, :, : self.rank * n]
            bs = self.slots.sub_columns(group, self.slots.b[group][layer].index_select(0, self.slot_ids)[:, : self.rank])
        xg = x.index_select(0, self.rows).to(a.dtype).view(a.shape[0], self.width, x.shape[1])
        buf = torch.bmm(xg, a)  # [G, C, rank * n], rank-major
        if self.keep is not None:
            buf.mul_(self.keep)
        if n == 1:
            delta = torch.bmm(buf, bs[0])
        else:
            # One copy to [n, G, C, rank]: bmm copies a non-contiguous operand batch by batch.
            per_sub = buf.view(*buf.shape[:2], self.rank, n).permute(3, 0, 1, 2).contiguous()
            delta = torch.cat([torch.bmm(per_sub[k], b) for k, b in enumerate(bs)], dim=-1)
        # Cast before adding: an in-place add across dtypes upcasts all of y and back (2 extra copies).
        y.add_(delta.view(-1, y.shape[1]).index_select(0, self.inverse).to(y.dtype))

    def _apply_kernels(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        a, b = self.slots.views(group, 0, self.slots.num_slots, self.rank)[layer]  # [S, rn, in], [S, out, rn]
        nd = self.num_decodes
        if nd:
            buf = dispatch.bgmv_shrink(x[:nd], a, self.scaling, self.token_slots)
            dispatch.bgmv_expand(y[:nd], buf, b, self.token_slots)
        if self.seg_slots is not None:
            xp, yp = x[nd:], y[nd:]
            buf = dispatch.sgmv_shrink(xp, a, self.scaling, self.seg_indptr, self.seg_slots,
                                       max_seg_len=self.max_seg_len)
            dispatch.sgmv_expand(yp, buf, b, self.seg_indptr, self.seg_slots, max_seg_len=self.max_seg_len)


def build_context(slots: LoRASlots, rows: list[tuple[int | None, int]], num_decodes: int, rank: int,
                  groups: frozenset[str], use_kernels: bool) -> LoRAStepContext:
    """rows: per request in batch order, (slot or None for the base model, tokens this step)."""
    ctx = LoRAStepContext(slots, groups, rank)
    device = slots.device
    num_tokens = sum(n for _, n in rows)
    if use_kernels:
        _kernel_metadata(ctx, rows, num_decodes, device)
    else:
        _gather_metadata(ctx, rows, num_tokens, slots.dtype, device)
    return ctx


def _gather_metadata(ctx: LoRAStepContext, rows: list[tuple[int | None, int]], num_tokens: int,
                     dtype: torch.dtype, device: torch.device) -> None:
    by_slot: dict[int, list[int]] = {}
    start = 0
    for slot, n in rows:
        if slot is not None:
            by_slot.setdefault(slot, []).extend(range(start, start + n))
        start += n
    real = sum(len(r) for r in by_slot.values())
    lo, hi = min(by_slot), max(by_slot) + 1
    width = max(len(r) for r in by_slot.values())
    if (hi - lo) * width <= MAX_PAD_RATIO * real:
        groups = [by_slot.get(s, []) for s in range(lo, hi)]
        ctx.slot_range = (lo, hi)
    else:
        # Equal chunks of about real / adapters rows: at most 2 x adapters groups, little padding.
        width = -(-real // len(by_slot))
        groups, ids = [], []
        for slot, toks in sorted(by_slot.items()):
            for i in range(0, len(toks), width):
                groups.append(toks[i : i + width])
                ids.append(slot)
        ctx.slot_ids = torch.tensor(ids, dtype=torch.long, device=device)
    if real < num_tokens and width * len(groups) == real:
        width += 1  # base-model tokens need a pad row (a zero delta) to read
    index, keep = [], []
    inverse = [-1] * num_tokens
    for toks in groups:
        pad = width - len(toks)
        for t in toks:
            inverse[t] = len(index)
            index.append(t)
        if pad:
            zero_row = len(index)
        index.extend([toks[0] if toks else 0] * pad)  # any valid row: its delta is zeroed by keep
        keep.extend([1.0] * len(toks) + [0.0] * pad)
    if real < num_tokens:
        inverse = [zero_row if i < 0 else i for i in inverse]
    ctx.rows = torch.tensor(index, dtype=torch.long, device=device)
    ctx.inverse = torch.tensor(inverse, dtype=torch.long, device=device)
    ctx.width = width
    if real < num_tokens:
        ctx.keep = torch.tensor(keep, dtype=dtype, device=device).view(len(groups), width, 1)


def _kernel_metadata(ctx: LoRAStepContext, rows: list[tuple[int | None, int]], num_decodes: int,
                     device: torch.device) -> None:
    ctx.num_decodes = num_decodes
    ctx.scaling = torch.ones(ctx.slots.num_slots, dtype=torch.float32, device=device)
    slot_of = [-1 if s is None else s for s, _ in rows]
    if num_decodes:
        ctx.token_slots = torch.tensor(slot_of[:num_decodes], dtype=torch.int32, device=device)
    if len(rows) > num_decodes:
        indptr, ids = [0], []
        for (_, n), slot in zip(rows[num_decodes:], slot_of[num_decodes:], strict=True):
            if ids and ids[-1] == slot:
                indptr[-1] += n  # same adapter as the previous chunk: one longer segment
            else:
                ids.append(slot)
                indptr.append(indptr[-1] + n)
        ctx.seg_indptr = torch.tensor(indptr, dtype=torch.int32, device=device)
        ctx.seg_slots = torch.tensor(ids, dtype=torch.int32, device=device)
        ctx.max_seg_len = max(b - a for a, b in zip(indptr, indptr[1:], strict=False))
