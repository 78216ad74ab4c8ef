"""The FP8 KV cache on the engine's attention paths (dataplane/models/attention.py) and in its config."""

from __future__ import annotations

import pytest
import torch

from dataplane.config import CacheConfig
from dataplane.models.attention import (
    AttentionMetadata,
    allocate_kv_cache,
    build_decode_groups,
    make_prefill_chunk,
    paged_attention,
    paged_attention_cpu,
    write_kv,
)
from kernels import cpu_decode, kv_fp8
from kernels.reference import paged_decode_attention_ref, prefill_attention_ref
from tests.kernels.fp8_cache import fp8_paged_cache
from tests.kernels.helpers import assert_close_to_scale

BLOCK_SIZE = 16
CPU = torch.device("cpu")
PATHS = [paged_attention] + ([paged_attention_cpu] if cpu_decode.available() else [])


def test_kv_cache_dtype_is_validated() -> None:
    assert CacheConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    for bad in ("fp16", "float8", "", None):
        with pytest.raises(ValueError, match="kv_cache_dtype"):
            CacheConfig(kv_cache_dtype=bad)


def test_write_kv_stores_quantized_rows_at_their_slots() -> None:
    kc = allocate_kv_cache(4, BLOCK_SIZE, 3, 64, torch.bfloat16, CPU, "fp8")
    vc = allocate_kv_cache(4, BLOCK_SIZE, 3, 64, torch.bfloat16, CPU, "fp8")
    assert kc.dtype == torch.uint8 and kc.shape == (4, BLOCK_SIZE, 3, 66)
    k, v = torch.randn(5, 3, 64).bfloat16(), torch.randn(5, 3, 64).bfloat16() * 7
    slots = torch.tensor([0, 17, 18, 40, 63])
    write_kv(kc, vc, k, v, slots)
    assert torch.equal(kc.view(-1, 3, 66)[slots], kv_fp8.quantize(k))
    assert torch.equal(vc.view(-1, 3, 66)[slots], kv_fp8.quantize(v))
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[slots] = False
    assert kc.view(-1, 3, 66)[untouched].eq(0).all()


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 8)])
def test_decodes_read_fp8_as_the_reference_does(attention, dtype, heads, kv_heads) -> None:
    lens = [1, 15, 16, 17, 40, 130, 131, 300]
    k8, v8, tables, _, _ = fp8_paged_cache(64, BLOCK_SIZE, kv_heads, 32, lens)
    q = torch.randn(len(lens), heads, 32).to(dtype)
    rows = [tables[i, : -(-n // BLOCK_SIZE)].tolist() for i, n in enumerate(lens)]
    groups = build_decode_groups(lens, rows, BLOCK_SIZE, CPU)
    meta = AttentionMetadata(torch.zeros(len(lens), dtype=torch.long), BLOCK_SIZE, groups)
    expected = paged_decode_attention_ref(q, k8, v8, tables, torch.tensor(lens, dtype=torch.int32), 0.2)
    for _ in range(2):  # the second layer of a step refills the group's workspace
        out = attention(q, q[:, :kv_heads], q[:, :kv_heads], k8, v8, meta, 0.2)
        assert_close_to_scale(out, expected.view(len(lens), -1))  # rows of very different sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_chunks_read_fp8_as_the_reference_does(dtype) -> None:
    # A chunk over a cached prefix reads the cache; a first chunk attends to its own K/V, rounded through
    # FP8 as the cache holds them, so both equal the reference reading the cache.
    prefix, chunk = 37, 20
    kc = allocate_kv_cache(8, BLOCK_SIZE, 3, 32, dtype, CPU, "fp8")
    vc = allocate_kv_cache(8, BLOCK_SIZE, 3, 32, dtype, CPU, "fp8")
    total = prefix + chunk
    k, v = (torch.randn(total, 3, 32) * 5).to(dtype), torch.randn(total, 3, 32).to(dtype)
    blocks = [5, 2, 7, 0]
    slots = torch.tensor([blocks[i // BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE for i in range(total)])
    write_kv(kc, vc, k, v, slots)
    tables = torch.tensor([blocks], dtype=torch.int32)
    q = torch.randn(total, 9, 32).to(dtype)
    first = AttentionMetadata(slots, BLOCK_SIZE, prefills=[make_prefill_chunk(0, total, 0, blocks, CPU)])
    out = paged_attention(q, k, v, kc, vc, first, 0.2)
    expected = prefill_attention_ref(q, kc, vc, tables, torch.tensor([0, total], dtype=torch.int32),
                                     torch.tensor([total], dtype=torch.int32), 0.2)
    assert_close_to_scale(out, expected.view(total, -1))
    later = AttentionMetadata(slots[prefix:], BLOCK_SIZE, prefills=[make_prefill_chunk(0, chunk, prefix, blocks, CPU)])
    out = paged_attention(q[prefix:], k[prefix:], v[prefix:], kc, vc, later, 0.2)
    assert_close_to_scale(out, expected[prefix:].reshape(chunk, -1))
