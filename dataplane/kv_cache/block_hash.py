"""Hash chains over full KV blocks.

Each block's hash covers its parent's hash, its token ids and the request's extra keys
(adapter, tenant cache salt), so two blocks match only when everything before them matches
too and they belong to the same adapter and salt. SHA-256 rather than Python's hash():
the cache is shared across tenants' requests, so collisions must not be craftable.
"""

from __future__ import annotations

import hashlib
from array import array

from dataplane.request import Request

_ROOT = b"tessera-kv-v1"


def root_hash(adapter: str | None, cache_salt: str | None) -> bytes:
    h = hashlib.sha256(_ROOT)
    h.update(b"\x00adapter\x00" + (adapter or "").encode())
    h.update(b"\x00salt\x00" + (cache_salt or "").encode())
    return h.digest()


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def update_block_hashes(request: Request, block_size: int) -> list[bytes]:
    """Extend request.block_hashes to cover every full block of its known tokens."""
    hashes = request.block_hashes
    tokens = request.all_token_ids
    full = len(tokens) // block_size
    if len(hashes) < full:
        parent = hashes[-1] if hashes else root_hash(request.adapter, request.cache_salt)
        for i in range(len(hashes), full):
            parent = block_hash(parent, tokens[i * block_size : (i + 1) * block_size])
            hashes.append(parent)
    return hashes


def prefix_hashes(token_ids: list[int], block_size: int, adapter: str | None, cache_salt: str | None) -> list[bytes]:
    """The hash chain of `token_ids`' full blocks, as a request with these tokens, adapter and salt has it."""
    parent = root_hash(adapter, cache_salt)
    out = []
    for i in range(len(token_ids) // block_size):
        parent = block_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
