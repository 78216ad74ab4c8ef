"""An engine's KV blocks by prefix, out and in: what prefill/decode disaggregation moves between workers.

The prefill side computes a prompt and exports the blocks of its hash chain (from the KV cache, then from
its second tier where the first run ends); the decode side keeps what it receives in its second tier, where
its own lookup finds it when the request arrives (kv_cache/second_tier.py). Every function here runs on the
engine's thread (AsyncLLM._call): between steps, so no block changes owner while it is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataplane.kv_cache.block_hash import prefix_hashes
from dataplane.kv_cache.transfer import layout_fingerprint
from dataplane.runner.block_transfer import block_bytes, read_blocks

if TYPE_CHECKING:
    from dataplane.engine.core import EngineCore


def layout(core: EngineCore) -> tuple[bytes, int]:
    """(fingerprint, block bytes) of this engine's KV blocks: both sides must agree to exchange them."""
    a = core.model.args
    caches = core.runner.kv_caches
    fp = layout_fingerprint(core.model_name, core.model.dtype, core.memory.kv_cache_dtype, core.scheduler.kv.block_size,
                            a.num_layers, a.num_kv_heads, a.head_dim)
    return fp, block_bytes(caches)


def _chain(core: EngineCore, token_ids: list[int], cache_salt: str | None) -> list[bytes]:
    """The blocks a request with these tokens could take from a cache: all its full blocks but the one holding
    the last token, which the receiving engine computes (its logits give the first token)."""
    bs = core.scheduler.kv.block_size
    return prefix_hashes(token_ids, bs, None, cache_salt)[: (len(token_ids) - 1) // bs]


def wanted_blocks(core: EngineCore, token_ids: list[int], cache_salt: str | None) -> tuple[int, list[bytes]]:
    """(leading blocks of the prompt this engine already holds in either tier, the hashes of the rest): the
    sender skips the first and must send exactly the second, in order."""
    kv = core.scheduler.kv
    chain = _chain(core, token_ids, cache_salt)
    n = 0
    for h in chain:
        if kv.pool.lookup(h) is None and (kv.tier is None or h not in kv.tier):
            break
        n += 1
    return n, chain[n:]


def export_prefix(core: EngineCore, token_ids: list[int], cache_salt: str | None, skip: int = 0
                  ) -> list[tuple[bytes, bytes | memoryview]]:
    """(hash, bytes) of the prompt's cached blocks after the first `skip`, as long as the chain is held: a
    copy of them, taken now (views of one host buffer; the blocks may change owner once this returns)."""
    kv = core.scheduler.kv
    hashes = _chain(core, token_ids, cache_salt)[skip:]
    ids = []
    for h in hashes:
        block = kv.pool.lookup(h)
        if block is None:
            break
        ids.append(block.block_id)
    out: list[tuple[bytes, bytes]] = []
    if ids:
        rows, ready = read_blocks(core.runner.kv_caches, ids)
        if ready is not None:
            ready.synchronize()
        host = rows.numpy()  # on the CPU read_blocks' gather is already a copy; on a GPU, pinned host memory
        out = [(h, memoryview(host[i])) for i, h in enumerate(hashes[: len(ids)])]
    if kv.tier is not None and len(out) < len(hashes):
        out += list(zip(hashes[len(out):], kv.tier.load(hashes[len(out):]), strict=False))
    return out


def import_blocks(core: EngineCore, blocks: list[tuple[bytes, bytes]]) -> int:
    """Keep received blocks in the second tier; how many were kept."""
    tier = core.scheduler.kv.tier
    if tier is None:
        raise ValueError("receiving KV blocks needs a second tier (kv_offload_size)")
    return sum(tier.insert(h, payload) for h, payload in blocks)
