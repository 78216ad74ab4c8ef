"""The pool of KV blocks: ref counts, a free queue in eviction order, and the prefix-cache map."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once the block is full and its tokens are known


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: the KV cache must hold at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks, least recently used first. A freed block that holds a cached prefix stays
        # findable through `cached` until it is handed out again (evicted).
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, KVBlock] = {}
        self.queries = 0  # prefix-cache lookups, in tokens
        self.hits = 0  # tokens found
        # (block id, hash) of cached blocks handed out since the caller last took the list; None: not
        # recorded (no second tier to keep them in)
        self.evicted: list[tuple[int, bytes]] | None = None

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def take(self, n: int) -> list[KVBlock]:
        """Hand out `n` free blocks, evicting the least recently used cached ones."""
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} blocks with {len(self.free)} free")  # callers check first
        out = []
        for _ in range(n):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                    if self.evicted is not None:
                        self.evicted.append((block_id, block.block_hash))
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on blocks found in the prefix cache."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free[block.block_id]
            block.ref_cnt += 1

    def release(self, blocks: list[KVBlock]) -> None:
        """Drop a reference; blocks reaching zero join the free queue's tail (evicted last)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {block.block_id} released more often than taken")
            if block.ref_cnt == 0:
                self.free[block.block_id] = None

    def cache(self, block: KVBlock, block_hash: bytes) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        # An equal block already cached keeps its place; this one is just not findable.
        self.cached.setdefault(block_hash, block)

    def forget(self, blocks: list[KVBlock]) -> None:
        """Drop blocks from the prefix cache (their contents can no longer be trusted)."""
        for block in blocks:
            if block.block_hash is not None and self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> None:
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
