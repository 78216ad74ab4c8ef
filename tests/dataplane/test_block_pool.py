"""Block pool and KV cache manager, no model."""

import pytest

from dataplane.kv_cache.block_hash import block_hash, root_hash, update_block_hashes
from dataplane.kv_cache.block_pool import BlockPool
from dataplane.kv_cache.manager import KVCacheManager
from tests.dataplane.helpers import make_request


def test_take_and_release_keep_ref_counts():
    pool = BlockPool(4)
    a, b = pool.take(2)
    assert (a.ref_cnt, b.ref_cnt, pool.num_free) == (1, 1, 2)
    pool.touch([a])
    pool.release([a])
    assert a.ref_cnt == 1 and pool.num_free == 2
    pool.release([a, b])
    assert pool.num_free == 4
    with pytest.raises(RuntimeError):
        pool.release([a])


def test_cached_free_blocks_are_evicted_least_recently_used_first():
    pool = BlockPool(3)
    blocks = pool.take(3)
    for i, blk in enumerate(blocks):
        pool.cache(blk, bytes([i]))
    pool.release([blocks[1]])
    pool.release([blocks[0]])
    pool.release([blocks[2]])
    assert pool.lookup(b"\x01") is blocks[1]
    (evicted,) = pool.take(1)
    assert evicted is blocks[1] and pool.lookup(b"\x01") is None
    assert pool.lookup(b"\x00") is blocks[0] and pool.lookup(b"\x02") is blocks[2]


def test_hash_chain_covers_parent_adapter_and_salt():
    r1 = make_request("a", prompt_len=8)
    r2 = make_request("b", prompt_len=8)
    r3 = make_request("c", prompt_len=8, cache_salt="tenant-2")
    r4 = make_request("d", prompt_len=8, adapter="lora-x")
    h1, h2, h3, h4 = (update_block_hashes(r, 4) for r in (r1, r2, r3, r4))
    assert h1 == h2 and len(h1) == 2
    assert h1[0] != h3[0] and h1[0] != h4[0] and h3[0] != h4[0]
    assert h1[1] == block_hash(h1[0], r1.all_token_ids[4:8])
    assert h1[0] == block_hash(root_hash(None, None), r1.all_token_ids[:4])
    # Same second block tokens after a different first block: a different hash.
    r5 = make_request("e", prompt_len=8)
    r5.all_token_ids[0] = 1
    assert update_block_hashes(r5, 4)[1] != h1[1]


def test_prefix_hits_never_cover_the_whole_prompt():
    kv = KVCacheManager(16, 4)
    first = make_request("a", prompt_len=8)
    assert kv.allocate_slots(first, 8) is not None
    kv.free(first)
    again = make_request("b", prompt_len=8)
    hits, n = kv.get_computed_blocks(again)
    # 8 tokens = 2 full blocks, but one token must be computed to produce logits: only 1 block hits.
    assert n == 4 and len(hits) == 1


def test_allocate_refuses_when_short_and_counts_idle_hits():
    kv = KVCacheManager(4, 4)
    a = make_request("a", prompt_len=12)
    assert kv.allocate_slots(a, 12) is not None  # 3 blocks
    kv.free(a)  # cached, free
    b = make_request("b", prompt_len=13)
    hits, n = kv.get_computed_blocks(b)
    assert n == 12
    # 13 + 4 tokens need 5 blocks > 4 in the pool.
    assert kv.allocate_slots(b, 5, hits) is None
    assert kv.pool.num_free == 4 and all(blk.ref_cnt == 0 for blk in kv.pool.blocks)
    assert kv.allocate_slots(b, 1, hits) is not None
    assert kv.pool.num_free == 0


def test_free_releases_tail_first_so_prefixes_survive_longest():
    kv = KVCacheManager(4, 2)
    a = make_request("a", prompt_len=8)
    kv.allocate_slots(a, 8)
    ids = kv.block_ids("a")
    kv.free(a)
    assert list(kv.pool.free)[-4:] == list(reversed(ids))
