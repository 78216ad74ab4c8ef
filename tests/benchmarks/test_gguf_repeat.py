"""benchmarks/gguf_repeat.py: a full-depth model rebuilt on the GPU machine from the shipped cut.

A small GGUF is written here with `gguf`'s own writer (block tensors of two layers, unblocked tensors,
scalar and array metadata), so the file-level claims are checked in a second; the engine loading such a
model runs in the rehearsal of the whole check (test_gpu_check_rehearsal.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.gguf_repeat import repeat
from benchmarks.gguf_truncate import block_count, truncate


def _write_small(path: Path, layers: int = 2) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(8)
    writer.add_token_list([f"t{i}" for i in range(16)])
    writer.add_float32("llama.rope.freq_base", 10000.0)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((16, 8)).astype(np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((8, 8)).astype(np.float16))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", rng.standard_normal(8).astype(np.float32))
    writer.add_tensor("output_norm.weight", rng.standard_normal(8).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tensors(path: Path) -> dict[str, np.ndarray]:
    import gguf

    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


def _fields(path: Path) -> dict[str, object]:
    import gguf

    return {f.name: f.contents() for f in gguf.GGUFReader(str(path)).fields.values() if not f.name.startswith("GGUF.")}


def test_blocks_repeat_in_order_with_everything_else_kept(tmp_path):
    src, dst = tmp_path / "two.gguf", tmp_path / "five.gguf"
    _write_small(src)
    size = repeat(src, dst, 5)
    assert size == dst.stat().st_size and block_count(dst) == 5
    have, got = _tensors(src), _tensors(dst)
    assert sorted(got) == sorted(["token_embd.weight", "output_norm.weight"]
                                 + [f"blk.{i}.{n}" for i in range(5) for n in ("attn_q.weight", "attn_norm.weight")])
    for i in range(5):  # block i is block i mod 2: in order, not the last block held
        for n in ("attn_q.weight", "attn_norm.weight"):
            assert got[f"blk.{i}.{n}"].dtype == have[f"blk.{i % 2}.{n}"].dtype
            assert np.array_equal(got[f"blk.{i}.{n}"], have[f"blk.{i % 2}.{n}"]), (i, n)
    assert not np.array_equal(got["blk.2.attn_q.weight"], have["blk.1.attn_q.weight"])
    for n in ("token_embd.weight", "output_norm.weight"):
        assert np.array_equal(got[n], have[n])
    before, after = _fields(src), _fields(dst)
    assert after.pop("llama.block_count") == 5 and before.pop("llama.block_count") == 2
    assert after == before  # the tokenizer and every other key as they were


def test_truncate_keeps_the_first_blocks_of_the_same_writer(tmp_path):
    src, dst = tmp_path / "two.gguf", tmp_path / "one.gguf"
    _write_small(src)
    truncate(src, dst, 1)
    got, have = _tensors(dst), _tensors(src)
    assert block_count(dst) == 1 and not any(n.startswith("blk.1.") for n in got)
    assert np.array_equal(got["blk.0.attn_q.weight"], have["blk.0.attn_q.weight"])


def test_refuses_no_layers(tmp_path):
    src = tmp_path / "two.gguf"
    _write_small(src)
    with pytest.raises(ValueError, match="--layers must be >= 1"):
        repeat(src, tmp_path / "none.gguf", 0)
