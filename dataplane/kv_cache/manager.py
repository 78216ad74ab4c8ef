"""Per-request block tables over the block pool; the scheduler's only window onto KV memory."""

from __future__ import annotations

from dataplane.kv_cache.block_hash import update_block_hashes
from dataplane.kv_cache.block_pool import BlockPool, KVBlock
from dataplane.kv_cache.second_tier import SecondTier
from dataplane.request import Request

_NONE_NEW: list[KVBlock] = []  # append_slot's answer when no block is needed (never mutated)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 tier: SecondTier | None = None) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks of the request already hashed
        # The prefix cache's second tier (second_tier.py): evicted blocks go there, hits come back from it.
        # The runner moves the bytes: each step's output carries the saves (blocks to copy out before the
        # forward overwrites them) and the loads (payloads to copy in before the forward reads them).
        self.tier = tier if enable_caching else None
        if self.tier is not None:
            self.pool.evicted = []
        self.loads: dict[int, bytes] = {}  # block id -> payload, this step
        self._loading: dict[str, list[int]] = {}  # request -> its blocks in `loads`
        # Second-tier payloads a lookup found, as (request id, first block, payloads): `_found` is the last
        # lookup's answer (what allocate_slots loads), `_read` what was last read: a request that waits for
        # room asks again next step, and must not read and verify the same bytes again.
        self._found: tuple[str, int, list[bytes]] | None = None
        self._read: tuple[str, int, list[bytes]] | None = None

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest run of the request's leading full blocks already in the cache.

        At least one token is always left to compute: the step that computes it yields the logits.
        """
        if not self.pool.enable_caching or request.sampling_params.pooling == "mean":
            return [], 0  # a mean-pooled embedding needs every position's hidden state (runner/pooling.py)
        hashes = update_block_hashes(request, self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for h in hashes[:max_blocks]:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        num = len(hits)
        self._found = None
        if self.tier is not None and num < max_blocks and hashes[num] in self.tier:
            read = self._read
            if read is None or read[0] != request.request_id or read[1] != num:
                read = self._read = (request.request_id, num, self.tier.load(hashes[num:max_blocks]))
            if read[2]:
                self._found = read
                num += len(read[2])
        return hits, num * self.block_size

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count a lookup whose result was used (a refused admission retries and must not count twice)."""
        self.pool.queries += num_tokens
        self.pool.hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: list[KVBlock] | None = None) -> list[KVBlock] | None:
        """Make room for `num_new_tokens` more tokens; None when the pool is short (preempt something).

        `computed_blocks`: an admission's first-tier hits (get_computed_blocks); the second-tier blocks that
        lookup found follow them, in new blocks this step's loads fill."""
        loaded: list[bytes] = []
        found = self._found
        if computed_blocks is None:
            computed_blocks = []
        elif found is not None and found[0] == request.request_id and found[1] == len(computed_blocks):
            loaded = found[2]
        have = self.req_blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + (len(computed_blocks) + len(loaded)) * self.block_size
        need = self.blocks_needed(num_computed + num_new_tokens) - len(have) - len(computed_blocks)
        # Cached hits with no owner sit in the free queue: taking them shrinks what is free.
        idle_hits = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if need > self.pool.num_free - idle_hits:
            return None
        if computed_blocks:
            self.pool.touch(computed_blocks)
        new = self.pool.take(max(need, 0))
        blocks = self.req_blocks.setdefault(request.request_id, [])
        blocks.extend(computed_blocks)
        blocks.extend(new)
        if loaded:
            self._found = self._read = None
            targets = [b.block_id for b in new[: len(loaded)]]
            self.loads.update(zip(targets, loaded, strict=True))
            self._loading[request.request_id] = targets
            new = new[len(loaded):]  # what the request computes into (the loaded ones are already known)
        self._cache_full_blocks(request, num_computed + num_new_tokens)
        return new

    def take_transfers(self) -> tuple[list[tuple[int, bytes]], dict[int, bytes]]:
        """This step's second-tier traffic, handed to the runner: (block id, hash) of evicted blocks to save,
        {block id: payload} to load. Saves run first: a block may be both (evicted, then loaded into)."""
        saves, loads = self.pool.evicted or [], self.loads
        if saves:
            self.pool.evicted = []
        if loads:
            self.loads, self._loading = {}, {}
        return saves, loads

    def append_slot(self, request: Request) -> list[KVBlock] | None:
        """allocate_slots(request, 1) for a running request's decode. Most steps the token lands in a
        block the request holds and nothing is published: no pool call, no list built."""
        have = self.req_blocks.get(request.request_id)
        n = request.num_computed_tokens + 1
        if have is None or n > len(have) * self.block_size:
            return self.allocate_slots(request, 1)
        if self.pool.enable_caching and (min(n, request.num_tokens) // self.block_size
                                         > self.num_cached_blocks.get(request.request_id, 0)):
            self._cache_full_blocks(request, n)  # a block of known tokens is full: publish it
        return _NONE_NEW

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Publish blocks that this step fills with known tokens to the prefix cache."""
        if not self.pool.enable_caching:
            return
        full = min(num_tokens, request.num_tokens) // self.block_size
        done = self.num_cached_blocks.get(request.request_id, 0)
        if full <= done:
            return
        hashes = update_block_hashes(request, self.block_size)
        blocks = self.req_blocks[request.request_id]
        for i in range(done, full):
            self.pool.cache(blocks[i], hashes[i])
        self.num_cached_blocks[request.request_id] = full

    def free(self, request: Request, *, forget: bool = False) -> None:
        """Return the request's blocks; the tail first, so shared prefixes are evicted last."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        if forget:
            self.pool.forget([b for b in blocks if b.ref_cnt == 1])
        if self._loading:
            self._drop_loads(request.request_id)
        self.pool.release(list(reversed(blocks)))

    def _drop_loads(self, request_id: str) -> None:
        """A request freed in the step that loads its blocks (preempted right after admission): a block no
        one else holds is not loaded, and unpublished, since its bytes never arrive; one that another request
        of this step found in the first tier keeps its load."""
        for block_id in self._loading.pop(request_id, []):
            block = self.pool.blocks[block_id]
            if block.ref_cnt == 1:
                self.pool.forget([block])
                del self.loads[block_id]

    def forget_uncomputed(self, request: Request) -> None:
        """Unpublish the request's blocks past its computed tokens: blocks are published when allocated,
        so a chunk scheduled and then dropped in the same step (a preemption) left them holding nothing."""
        blocks = self.req_blocks.get(request.request_id, [])
        self.pool.forget(blocks[request.num_computed_tokens // self.block_size:])

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, in both tiers."""
        self.pool.reset_prefix_cache()
        if self.tier is not None:
            self.tier.clear()
        self._found = self._read = None

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def usage(self) -> float:
        return self.pool.usage()
