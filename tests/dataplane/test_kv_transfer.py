"""The KV block stream between workers: what comes out whole and verified, and every way a stream can be
wrong refused with a ValueError (the receiver then computes the rest itself)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from dataplane.kv_cache.transfer import MAX_BLOCKS, Decoder, encode, layout_fingerprint

LAYOUT = layout_fingerprint("smollm2", "bfloat16", "auto", 16)
BB = 48  # block bytes


def blocks(n: int) -> list[tuple[bytes, bytes]]:
    return [(hashlib.sha256(b"h%d" % i).digest(), bytes([i % 256]) * BB) for i in range(n)]


def stream(n: int) -> bytes:
    return b"".join(encode(blocks(n), LAYOUT, BB))


@pytest.mark.parametrize("chunk", [1, 7, 80, 10_000])
def test_blocks_come_through_whatever_the_chunking(chunk):
    data, d = stream(5), Decoder(LAYOUT, BB)
    for i in range(0, len(data), chunk):
        d.feed(data[i:i + chunk])
    assert d.finish() == blocks(5)


def test_an_empty_stream_is_a_valid_answer():
    d = Decoder(LAYOUT, BB)
    d.feed(stream(0))
    assert d.finish() == []


def test_a_short_stream_keeps_the_whole_blocks_before_the_cut():
    data, d = stream(4), Decoder(LAYOUT, BB)
    d.feed(data[: len(data) - BB // 2])  # the sender died inside its last block
    assert d.blocks == blocks(3)
    with pytest.raises(ValueError, match="after 3 of 4 blocks"):
        d.finish()


def test_a_corrupt_block_stops_the_stream_there():
    data = bytearray(stream(3))
    data[-1] ^= 1
    d = Decoder(LAYOUT, BB)
    with pytest.raises(ValueError, match="block 2 failed its checksum"):
        d.feed(bytes(data))
    assert d.blocks == blocks(2)


@pytest.mark.parametrize("layout,block_bytes", [(layout_fingerprint("other"), BB), (LAYOUT, BB * 2)])
def test_another_layout_is_refused_before_any_block(layout, block_bytes):
    d = Decoder(layout, block_bytes)
    with pytest.raises(ValueError, match="another layout"):
        d.feed(stream(2))
    assert d.blocks == []


def test_garbage_overlong_and_absurd_streams_are_refused():
    with pytest.raises(ValueError, match="not a KV block stream"):
        Decoder(LAYOUT, BB).feed(b"HTTP/1.1 200 OK\r\n\r\n" + b"\x00" * 64)
    d = Decoder(LAYOUT, BB)
    d.feed(stream(1) + b"x")
    with pytest.raises(ValueError, match="ended after"):
        d.finish()
    extra = stream(1) + next(iter(encode(blocks(2), LAYOUT, BB)))[:0] + b"".join(list(encode(blocks(1), LAYOUT, BB))[1:])
    with pytest.raises(ValueError, match="longer than announced"):
        Decoder(LAYOUT, BB).feed(extra)
    header = struct.pack("<4sB16sII", b"TKVX", 1, LAYOUT, BB, MAX_BLOCKS + 1)
    with pytest.raises(ValueError, match="announces"):
        Decoder(LAYOUT, BB).feed(header)
    with pytest.raises(ValueError, match="before its header"):
        Decoder(LAYOUT, BB).finish()


def test_the_encoder_refuses_what_it_cannot_frame():
    with pytest.raises(ValueError):
        list(encode([(b"short", b"\x00" * BB)], LAYOUT, BB))
    with pytest.raises(ValueError):
        list(encode([(b"\x00" * 32, b"\x00" * (BB - 1))], LAYOUT, BB))
