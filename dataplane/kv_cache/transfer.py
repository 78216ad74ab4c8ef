"""The wire format of KV blocks sent from a prefill worker to a decode worker (docs/kv_cache.md, part 3).

    header: b"TKVX", version (u8), layout fingerprint (16 bytes), block bytes (u32), block count (u32)
    then per block: hash (32 bytes), CRC-32 of the payload (u32), payload (block bytes)

Integers little-endian. The layout fingerprint names everything that decides what a block's bytes mean
(model, dtype, KV-cache dtype, block size, layers and heads): a decode worker refuses blocks of another
layout instead of reading them wrong. The decoder is incremental (bytes arrive as the HTTP body streams)
and strict: a short, long, corrupt or foreign stream raises ValueError, and the receiver keeps only the
blocks that came whole and verified before it (each one is usable on its own: a prefix of the chain).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterator

MAGIC = b"TKVX"
VERSION = 1
_HEADER = struct.Struct("<4sB16sII")
_BLOCK = struct.Struct("<32sI")
MAX_BLOCKS = 1 << 20  # a million blocks is far past any context; a bigger count is a broken stream


def layout_fingerprint(*parts: object) -> bytes:
    return hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:16]


def encoded_size(num_blocks: int, block_bytes: int) -> int:
    """The stream's length in bytes (sent as Content-Length: no chunked framing to parse on either side)."""
    return _HEADER.size + num_blocks * (_BLOCK.size + block_bytes)


def encode(blocks: list[tuple[bytes, bytes]], layout: bytes, block_bytes: int) -> Iterator[bytes]:
    """The stream for `blocks` [(hash, payload)]: each block's frame header, then its payload as given (no
    copy; any buffer)."""
    yield _HEADER.pack(MAGIC, VERSION, layout, block_bytes, len(blocks))
    for h, payload in blocks:
        if len(h) != 32 or len(payload) != block_bytes:
            raise ValueError("a KV block must have a 32-byte hash and block_bytes of payload")
        yield _BLOCK.pack(h, zlib.crc32(payload))
        yield payload


class Decoder:
    """Feed it the stream's bytes as they come; `blocks` holds the verified (hash, payload) pairs so far."""

    def __init__(self, layout: bytes, block_bytes: int) -> None:
        self.layout, self.block_bytes = layout, block_bytes
        self.blocks: list[tuple[bytes, bytes]] = []
        self.expected: int | None = None
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data
        if self.expected is None:
            if len(self._buf) < _HEADER.size:
                return
            magic, version, layout, block_bytes, count = _HEADER.unpack_from(self._buf)
            if magic != MAGIC or version != VERSION:
                raise ValueError("not a KV block stream (bad magic or version)")
            if layout != self.layout or block_bytes != self.block_bytes:
                raise ValueError("KV blocks of another layout (model, dtype, KV-cache dtype or block size differ)")
            if count > MAX_BLOCKS:
                raise ValueError(f"KV block stream announces {count} blocks")
            self.expected = count
            del self._buf[:_HEADER.size]
        step = _BLOCK.size + self.block_bytes
        while len(self._buf) >= step:
            if len(self.blocks) >= self.expected:
                raise ValueError("KV block stream longer than announced")
            h, crc = _BLOCK.unpack_from(self._buf)
            with memoryview(self._buf) as view:  # released before the buffer is trimmed below
                payload = bytes(view[_BLOCK.size:step])
            if zlib.crc32(payload) != crc:
                raise ValueError(f"KV block {len(self.blocks)} failed its checksum")
            self.blocks.append((h, payload))
            del self._buf[:step]

    def finish(self) -> list[tuple[bytes, bytes]]:
        """The blocks, once the stream has ended; ValueError if it ended early or with bytes left over."""
        if self.expected is None:
            raise ValueError("KV block stream ended before its header")
        if len(self.blocks) != self.expected or self._buf:
            raise ValueError(f"KV block stream ended after {len(self.blocks)} of {self.expected} blocks")
        return self.blocks
