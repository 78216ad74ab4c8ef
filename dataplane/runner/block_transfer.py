"""Whole KV blocks in and out of the paged cache, as bytes: what the prefix cache's second tier keeps.

A block's bytes are every layer's key then value rows of that block, [layers, 2, block_size, kv_heads,
row bytes], in the cache's own storage (the model's dtype, or FP8 rows with their scales): a block goes
back exactly as it came out, and a tier filled under one cache layout is never read under another (the
tier is one engine's, and its entries have that engine's block size in bytes).
"""

from __future__ import annotations

from typing import Protocol

import torch

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class BlockSink(Protocol):
    """Where the runner sends evicted blocks' bytes (kv_cache/second_tier.SecondTier): `rows[i]` is the block
    of hashes[i]; `ready` the event that marks the rows copied (None: now)."""

    def save(self, hashes: list[bytes], rows: torch.Tensor, ready: torch.cuda.Event | None = None) -> None: ...


def block_bytes(kv_caches: KVCaches) -> int:
    """Bytes of one block, all layers, K and V."""
    k = kv_caches[0][0]
    return 2 * len(kv_caches) * k[0].numel() * k.element_size()


def read_blocks(kv_caches: KVCaches, block_ids: list[int]) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Rows of uint8 on the host, one per block, and the event that marks them ready (None on the CPU: ready
    now). On a GPU the copy is queued behind the work already on the stream and ahead of the step that follows,
    which may overwrite the blocks: the host waits for the event, not the step."""
    device = kv_caches[0][0].device
    ids = torch.tensor(block_ids, dtype=torch.long, device=device)
    per_layer = [torch.stack((k.view(torch.uint8)[ids], v.view(torch.uint8)[ids]), dim=1) for k, v in kv_caches]
    rows = torch.stack(per_layer, dim=1).reshape(len(block_ids), -1)  # [n, layers, 2, ...] -> one row a block
    if device.type != "cuda":
        return rows, None
    host = torch.empty(rows.shape, dtype=torch.uint8, pin_memory=True)
    host.copy_(rows, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def write_blocks(kv_caches: KVCaches, block_ids: list[int], payloads: list[bytes]) -> None:
    """Copy `payloads` (block_bytes each, as read_blocks made them) into the cache's blocks `block_ids`."""
    k0 = kv_caches[0][0].view(torch.uint8)
    per_block = block_bytes(kv_caches)
    if any(len(p) != per_block for p in payloads):
        raise ValueError(f"KV block payloads must be {per_block} bytes each")
    device = k0.device
    data = torch.frombuffer(bytearray().join(payloads), dtype=torch.uint8)
    data = data.view(len(payloads), len(kv_caches), 2, *k0.shape[1:]).to(device, non_blocking=True)
    ids = torch.tensor(block_ids, dtype=torch.long, device=device)
    for layer, (k, v) in enumerate(kv_caches):
        k.view(torch.uint8).index_copy_(0, ids, data[:, layer, 0])
        v.view(torch.uint8).index_copy_(0, ids, data[:, layer, 1])
