"""The prefix cache's second tier: full KV blocks evicted from the pool, kept by their hash in host memory
or in a bounded local directory, and loaded back instead of recomputed (docs/kv_cache.md).

The first tier (block_pool.py) holds blocks in the engine's KV cache; when it hands a free block with a
published hash to a new owner, the block's bytes come here instead of being lost. Entries are keyed by the
block's hash chain, which is rooted in the adapter key and the tenant's cache salt (block_hash.py): a hit
here is a hit only under the same salt, exactly as in the first tier. The tier is one engine's: it starts
empty (a directory is emptied of its entries at start), so nothing in it outlives the model it was filled
by; an adapter loaded again gets a new key, so its old blocks are never matched.

Saves run on one writer thread (checksum and copy, or the file write, overlap the next forward); an entry
becomes findable once written. Loads are read and verified on the scheduler's thread before the blocks are
promised to a request: a missing, short or corrupt entry ends the hit run there and the rest is
recomputed, never read wrong.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dataplane.stats import TierStats

_MAGIC = b"TKV1"
_HEADER = len(_MAGIC) + 4  # magic, then the payload's CRC-32 (little endian)
_SUFFIX = ".kv"


class SecondTier:
    """A bounded LRU of KV blocks by hash. `directory`: files there (one per block); None: host memory."""

    def __init__(self, capacity_bytes: int, block_bytes: int, directory: str | os.PathLike | None = None) -> None:
        if capacity_bytes < block_bytes + _HEADER:
            raise ValueError(f"kv_offload_size: {capacity_bytes} bytes hold no KV block of {block_bytes} bytes")
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.entry_bytes = block_bytes + _HEADER
        self._index: OrderedDict[bytes, None] = OrderedDict()  # findable entries, least recently used first
        self._memory: dict[bytes, bytes] = {}  # the memory backend's entries
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-writer")
        self._pending: list[Future] = []
        self.stats = TierStats(capacity_bytes=capacity_bytes)
        self.directory: Path | None = None
        self._dir_lock = None
        if directory is not None:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            # One engine per directory: two would evict and overwrite each other's entries.
            self._dir_lock = open(self.directory / ".lock", "w")  # noqa: SIM115 - held for the tier's life
            try:
                fcntl.flock(self._dir_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._dir_lock.close()
                raise ValueError(f"kv_offload_dir: {self.directory} is in use by another engine") from None
            self._clear_directory()

    # -- the scheduler's side ------------------------------------------------------------------
    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def __len__(self) -> int:
        return len(self._index)

    def load(self, hashes: list[bytes]) -> list[bytes]:
        """The payloads of the leading run of `hashes` held here and intact (stops at the first that is not)."""
        t0 = time.perf_counter()
        out: list[bytes] = []
        for h in hashes:
            with self._lock:
                if h not in self._index:
                    break
                self._index.move_to_end(h)
            payload = self._read(h)
            if payload is None:
                self.stats.failed_loads += 1
                self._drop(h)
                break
            out.append(payload)
        self.stats.loaded_blocks += len(out)
        self.stats.loaded_bytes += len(out) * self.block_bytes
        self.stats.load_seconds += time.perf_counter() - t0
        return out

    def clear(self) -> None:
        """Forget every entry (the prefix cache was reset: the model's weights or meaning changed)."""
        self.flush()
        with self._lock:
            self._index.clear()
            self._memory.clear()
            self.stats.held_blocks = self.stats.held_bytes = 0
        if self.directory is not None:
            self._clear_directory()

    # -- the runner's side ---------------------------------------------------------------------
    def save(self, hashes: list[bytes], rows: Any, ready: Any = None) -> None:
        """Keep evicted blocks: `rows[i]` (a uint8 tensor of block_bytes) is the block of hashes[i]. The
        checksum and the write run on the writer thread; `ready` (a CUDA event) is waited for there first,
        so a device -> host copy overlaps the step that follows it."""
        fresh = [(i, h) for i, h in enumerate(hashes) if h not in self._index]
        if fresh:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._writer.submit(self._write_all, fresh, rows, ready))

    def flush(self) -> None:
        """Wait for the saves handed over so far (tests, clear, close)."""
        for f in self._pending:
            f.result()
        self._pending = []

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)
        if self._dir_lock is not None:
            self._dir_lock.close()
            self._dir_lock = None

    # -- storage -------------------------------------------------------------------------------
    def _write_all(self, fresh: list[tuple[int, bytes]], rows: Any, ready: Any) -> None:
        if ready is not None:
            ready.synchronize()
        for i, h in fresh:
            self.insert(h, rows[i].numpy().tobytes())

    def insert(self, h: bytes, payload: bytes) -> bool:
        """Keep one block now (the writer thread's saves; blocks received from a prefill worker). False if it
        could not be written."""
        if len(payload) != self.block_bytes:
            raise ValueError(f"KV block of {len(payload)} bytes, the tier keeps {self.block_bytes}")
        entry = _MAGIC + zlib.crc32(payload).to_bytes(4, "little") + payload
        with self._lock:
            if h in self._index:
                self._index.move_to_end(h)
                return True
            self._make_room_locked()
            try:
                self._store(h, entry)
            except OSError:
                self.stats.failed_saves += 1
                return False
            self._index[h] = None
            self.stats.held_blocks += 1
            self.stats.held_bytes += len(entry)
            self.stats.saved_blocks += 1
            self.stats.saved_bytes += self.block_bytes
        return True

    def _make_room_locked(self) -> None:
        while self._index and self.stats.held_bytes + self.entry_bytes > self.capacity_bytes:
            victim, _ = self._index.popitem(last=False)
            self._unstore(victim)
            self.stats.held_blocks -= 1
            self.stats.held_bytes -= self.entry_bytes
            self.stats.evicted_blocks += 1

    def _drop(self, h: bytes) -> None:
        with self._lock:
            if h in self._index:
                del self._index[h]
                self._unstore(h)
                self.stats.held_blocks -= 1
                self.stats.held_bytes -= self.entry_bytes

    def _store(self, h: bytes, entry: bytes) -> None:
        if self.directory is None:
            self._memory[h] = entry
            return
        path = self._path(h)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(entry)
        os.replace(tmp, path)  # a reader never sees half a file

    def _unstore(self, h: bytes) -> None:
        if self.directory is None:
            self._memory.pop(h, None)
            return
        try:
            self._path(h).unlink()
        except FileNotFoundError:
            pass

    def _read(self, h: bytes) -> bytes | None:
        """The payload of entry `h` if its header, length and checksum are right; None otherwise."""
        if self.directory is None:
            entry = self._memory.get(h)
        else:
            try:
                entry = self._path(h).read_bytes()
            except OSError:
                entry = None
        if entry is None or len(entry) != self.entry_bytes or not entry.startswith(_MAGIC):
            return None
        payload = entry[_HEADER:]
        if zlib.crc32(payload) != int.from_bytes(entry[len(_MAGIC):_HEADER], "little"):
            return None
        return payload

    def _path(self, h: bytes) -> Path:
        assert self.directory is not None
        return self.directory / (h.hex() + _SUFFIX)

    def _clear_directory(self) -> None:
        """Remove this tier's own files (entries and half-written ones), nothing else in the directory."""
        assert self.directory is not None
        for p in self.directory.iterdir():
            if p.suffix in (_SUFFIX, ".tmp") and p.is_file():
                p.unlink(missing_ok=True)
