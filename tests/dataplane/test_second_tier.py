"""The prefix cache's second tier on its own and under the scheduler: what is evicted is kept, what is
found comes back through the step's loads, and a missing or corrupt entry is recomputed, never read."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

from dataplane.config import CacheConfig, SchedulerConfig
from dataplane.kv_cache.manager import KVCacheManager
from dataplane.kv_cache.second_tier import SecondTier
from dataplane.scheduler.output import SchedulerOutput
from dataplane.scheduler.scheduler import Scheduler
from tests.dataplane.helpers import FakeClock, assert_no_leaks, make_request, sampled

BLOCK_BYTES = 64


def payload(h: bytes) -> bytes:
    """A block's stand-in bytes, a function of its hash: a load can be checked against what was saved."""
    return (hashlib.sha256(h).digest() * 2)[:BLOCK_BYTES]


def rows(hashes: list[bytes]) -> torch.Tensor:
    return torch.stack([torch.frombuffer(bytearray(payload(h)), dtype=torch.uint8) for h in hashes])


def keys(n: int, tag: str = "k") -> list[bytes]:
    return [hashlib.sha256(f"{tag}{i}".encode()).digest() for i in range(n)]


@pytest.fixture(params=["memory", "directory"])
def tier(request, tmp_path):
    t = SecondTier(10 * (BLOCK_BYTES + 8), BLOCK_BYTES, tmp_path / "tier" if request.param == "directory" else None)
    yield t
    t.close()


def test_saved_blocks_come_back_in_order_until_the_first_missing_one(tier):
    k = keys(4)
    tier.save(k[:2] + k[3:], rows(k[:2] + k[3:]))
    tier.flush()
    assert len(tier) == 3 and k[2] not in tier
    assert tier.load(k) == [payload(k[0]), payload(k[1])]  # k[2] is missing: k[3] is not reached
    assert tier.stats.loaded_blocks == 2 and tier.stats.loaded_bytes == 2 * BLOCK_BYTES
    assert tier.stats.saved_blocks == 3 and tier.stats.held_bytes == 3 * (BLOCK_BYTES + 8)


def test_the_byte_cap_evicts_the_least_recently_used(tier):
    k = keys(12)
    tier.save(k[:10], rows(k[:10]))
    tier.flush()
    assert tier.load([k[0]]) == [payload(k[0])]  # k[0] used: k[1] is now the oldest
    tier.save(k[10:], rows(k[10:]))
    tier.flush()
    assert len(tier) == 10 and tier.stats.evicted_blocks == 2
    assert k[0] in tier and k[1] not in tier and k[2] not in tier and k[11] in tier
    assert tier.stats.held_bytes <= tier.capacity_bytes


def test_a_block_saved_twice_is_kept_once(tier):
    k = keys(2)
    tier.save(k, rows(k))
    tier.flush()
    tier.save(k, rows(k))
    tier.flush()
    assert tier.stats.saved_blocks == 2 and len(tier) == 2


def test_corrupt_or_short_entries_are_dropped_not_returned(tmp_path):
    tier = SecondTier(1 << 20, BLOCK_BYTES, tmp_path)
    k = keys(3)
    tier.save(k, rows(k))
    tier.flush()
    f = tmp_path / (k[1].hex() + ".kv")
    data = bytearray(f.read_bytes())
    data[20] ^= 0x01  # one bit of the payload
    f.write_bytes(bytes(data))
    assert tier.load(k) == [payload(k[0])]
    assert tier.stats.failed_loads == 1 and k[1] not in tier and not f.exists()
    (tmp_path / (k[2].hex() + ".kv")).write_bytes(b"TKV1")  # truncated
    assert tier.load([k[2]]) == [] and tier.stats.failed_loads == 2
    (tmp_path / (k[0].hex() + ".kv")).unlink()  # gone behind the tier's back
    assert tier.load([k[0]]) == [] and tier.stats.failed_loads == 3
    assert len(tier) == 0 and tier.stats.held_bytes == 0
    tier.close()


def test_a_failed_write_keeps_nothing_and_the_tier_goes_on(tmp_path):
    tier = SecondTier(1 << 20, BLOCK_BYTES, tmp_path / "t")
    shutil.rmtree(tmp_path / "t")  # the disk under it is gone
    k = keys(2)
    tier.save(k, rows(k))
    tier.flush()
    assert tier.stats.failed_saves == 2 and len(tier) == 0 and tier.load(k) == []
    tier.close()


def test_a_directory_starts_empty_and_belongs_to_one_engine(tmp_path):
    first = SecondTier(1 << 20, BLOCK_BYTES, tmp_path)
    k = keys(2)
    first.save(k, rows(k))
    first.flush()
    (tmp_path / "notes.txt").write_text("not the tier's")
    with pytest.raises(ValueError, match="in use by another engine"):
        SecondTier(1 << 20, BLOCK_BYTES, tmp_path)
    first.close()
    # A new engine (a restart, another model) never finds the old entries; files not its own stay.
    second = SecondTier(1 << 20, BLOCK_BYTES, tmp_path)
    assert len(second) == 0 and not list(tmp_path.glob("*.kv")) and (tmp_path / "notes.txt").exists()
    second.close()


def test_sizes_are_checked(tmp_path):
    with pytest.raises(ValueError, match="kv_offload_size"):
        SecondTier(BLOCK_BYTES, BLOCK_BYTES)
    with pytest.raises(ValueError, match="kv_offload_size"):
        CacheConfig(kv_offload_size="-1GiB")
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        CacheConfig(kv_offload_size="1GiB", enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_offload_dir"):
        CacheConfig(kv_offload_dir=str(tmp_path))
    with pytest.raises(ValueError, match="kv_offload_dir"):
        CacheConfig(kv_offload_size="1GiB", kv_offload_dir="bad\x00dir")
    assert CacheConfig(kv_offload_size="1MiB").kv_offload_size == 1 << 20
    assert CacheConfig().kv_offload_size == 0


# -- under the scheduler: the step's saves and loads ---------------------------------------------


def tiered_scheduler(num_blocks: int, tier: SecondTier, block_size: int = 4, **cfg: object) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, **cfg})  # type: ignore[arg-type]
    return Scheduler(config, KVCacheManager(num_blocks, block_size, True, tier), 1024, clock=FakeClock())


def step(sched: Scheduler, tier: SecondTier, loaded: dict[int, bytes]) -> SchedulerOutput:
    """One step with a runner that keeps the tier's protocol: saves, then loads, then the forward."""
    out = sched.schedule()
    if out.kv_saves:
        tier.save([h for _, h in out.kv_saves], rows([h for _, h in out.kv_saves]))
        tier.flush()
    loaded.update(out.kv_loads)
    sched.update(out, sampled(sched, out))
    return out


def run(sched: Scheduler, tier: SecondTier, *reqs, loaded: dict[int, bytes] | None = None) -> list[SchedulerOutput]:
    loaded = {} if loaded is None else loaded
    for r in reqs:
        sched.add_request(r)
    outs = []
    while sched.has_unfinished():
        outs.append(step(sched, tier, loaded))
    return outs


def test_evicted_prefixes_come_back_from_the_tier_with_their_own_bytes():
    tier = SecondTier(1 << 20, BLOCK_BYTES)
    sched = tiered_scheduler(8, tier)  # 8 blocks of 4 tokens
    a = make_request("a", prompt_len=17, max_tokens=2)  # 4 full prompt blocks
    run(sched, tier, a)
    hashes = list(a.block_hashes[:4])
    run(sched, tier, make_request("b", prompt_len=29, max_tokens=2, first_token=900))  # takes all 8 blocks
    assert sum(h in tier for h in hashes) == 4
    again = make_request("a2", prompt_len=17, max_tokens=2)
    loaded: dict[int, bytes] = {}
    outs = run(sched, tier, again, loaded=loaded)
    assert again.num_cached_tokens == 16  # all four blocks, none recomputed
    assert outs[0].num_scheduled_tokens["a2"] == 1
    # each loaded block holds the bytes saved under the hash of the position it now takes
    table = [b.block_id for b in sched.kv.pool.blocks if b.block_hash in hashes]
    assert sorted(loaded) == sorted(table)
    assert {loaded[b.block_id] for b in sched.kv.pool.blocks if b.block_hash in hashes} == {payload(h) for h in hashes}
    assert sched.stats().prefix_cache_hits == 16 and sched.stats().kv_offload.loaded_blocks == 4
    assert_no_leaks(sched)


def test_another_salt_never_hits_the_tier():
    tier = SecondTier(1 << 20, BLOCK_BYTES)
    sched = tiered_scheduler(8, tier)
    run(sched, tier, make_request("a", prompt_len=17, max_tokens=2, cache_salt="tenant-a"))
    run(sched, tier, make_request("b", prompt_len=29, max_tokens=2, first_token=900))
    other = make_request("x", prompt_len=17, max_tokens=2, cache_salt="tenant-b")
    run(sched, tier, other)
    assert other.num_cached_tokens == 0 and tier.stats.loaded_blocks == 0
    same = make_request("y", prompt_len=17, max_tokens=2, cache_salt="tenant-a")
    run(sched, tier, same)
    assert same.num_cached_tokens == 16


def test_a_corrupt_entry_ends_the_hit_and_the_rest_is_recomputed(tmp_path):
    tier = SecondTier(1 << 20, BLOCK_BYTES, tmp_path)
    sched = tiered_scheduler(8, tier)
    a = make_request("a", prompt_len=17, max_tokens=2)
    run(sched, tier, a)
    run(sched, tier, make_request("b", prompt_len=29, max_tokens=2, first_token=900))
    (tmp_path / (a.block_hashes[2].hex() + ".kv")).write_bytes(b"garbage")
    again = make_request("a2", prompt_len=17, max_tokens=2)
    outs = run(sched, tier, again)
    assert again.num_cached_tokens == 8 and outs[0].num_scheduled_tokens["a2"] == 9
    assert len(outs[0].kv_loads) == 2 and tier.stats.failed_loads == 1
    assert_no_leaks(sched)


def test_a_request_freed_before_its_loads_ran_leaves_no_published_block_without_bytes():
    """Freed in the step that loads it (the scheduler never does this today: a later admission cannot
    outrank an earlier one; a defence for the paths that might): a block only it holds is neither loaded
    nor left findable; one that another request of the step found too keeps its load."""
    tier = SecondTier(1 << 20, BLOCK_BYTES)
    sched = tiered_scheduler(8, tier)
    a = make_request("a", prompt_len=17, max_tokens=2)
    run(sched, tier, a)
    run(sched, tier, make_request("b", prompt_len=29, max_tokens=2, first_token=900))
    kv = sched.kv
    first = make_request("first", prompt_len=17, max_tokens=2)
    hits, n = kv.get_computed_blocks(first)
    assert (hits, n) == ([], 16)
    assert kv.allocate_slots(first, 1, hits) is not None and len(kv.loads) == 4
    targets = set(kv.loads)
    second = make_request("second", prompt_len=9, max_tokens=2)  # shares the first two blocks
    hits2, n2 = kv.get_computed_blocks(second)
    assert n2 == 8 and kv.allocate_slots(second, 1, hits2) is not None
    kv.free(first)
    saves, loads = kv.take_transfers()
    shared = {b.block_id for b in hits2}
    assert set(loads) == shared  # the two blocks second holds keep their bytes' arrival
    published = {b.block_id for b in kv.pool.blocks if b.block_hash is not None}
    assert published & targets == shared
    kv.free(second)
    assert kv.pool.num_free == kv.pool.num_blocks
