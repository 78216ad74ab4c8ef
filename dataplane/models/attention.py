"""Attention over the paged KV cache: plain torch on the CPU, the Triton kernels on CUDA.

The batch is ordered decodes first (one query token each, sorted by context length), then
prefill chunks. On the torch path decodes run as a few batched matmuls, one per group of
similar context lengths, so padding waste stays bounded; each prefill chunk runs alone against
its cached prefix. Where the kernels run (kernels.dispatch.use_triton), all decodes form one
group, one launch of the paged decode kernel with one int32 block table, and all prefill chunks
one launch of the prefill kernel with cu_seqlens. Metadata is built once per step and passed to
every layer explicitly.

An FP8 cache (`kv_cache_dtype="fp8"`, kernels/kv_fp8.py: uint8 rows of E4M3 values and their
float16 scale) is quantized as it is written and dequantized where it is read: after the gather on
the torch path, inside the C++ and Triton ops. A prefill chunk with nothing cached before it
attends over its own K/V rounded through FP8 as well, so what a prompt sees is what its later
decodes (and a request reusing its blocks) read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from kernels import cpu_decode, dispatch, kv_fp8
from kernels.reference import write_kv_ref as write_kv  # noqa: F401  (the models' name for it)

# A decode group is cut when the next context is this much longer than the group's shortest:
# gathered K/V rows are padded to the group's longest, so this bounds the wasted gather traffic.
DECODE_GROUP_SPREAD = 1.5
# Decode groups of at most this many sequences attend in float32 on the torch path (_decode_attention);
# larger ones keep the 16-bit block-diagonal matmuls, where widening every gathered key would cost more.
FLOAT32_DECODE_ROWS = 2


@dataclass(slots=True)
class DecodeGroup:
    start: int  # first query row of the group in the flattened batch
    end: int  # one past the last query row
    block_tables: torch.Tensor  # [n, max_blocks] long (int32 for the kernels), padded with block 0
    mask: torch.Tensor | None  # [n, 1, 1, max_blocks * block_size] bool, True where the key is real (torch path)
    context_lens: torch.Tensor | None = None  # [n] int32 keys per query
    # Torch path: the gathered K and V, allocated by the first layer of the step and refilled by
    # the others. A fresh multi-MB tensor per layer costs page faults that took longer than the copy.
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(slots=True)
class PrefillChunk:
    start: int  # first query row in the flattened batch
    end: int  # one past the last query row
    prefix_len: int  # tokens already in the cache before this chunk
    block_ids: torch.Tensor  # [num_blocks] long, the request's blocks covering prefix + chunk
    mask: torch.Tensor | None = None  # [chunk, prefix + chunk] bool offset-causal mask; None without prefix


def make_prefill_chunk(start: int, end: int, prefix_len: int, block_ids: list[int],
                       device: torch.device) -> PrefillChunk:
    mask = None
    if prefix_len:
        # Query i sits at position prefix_len + i and sees keys 0 .. prefix_len + i.
        mask = torch.ones((end - start, prefix_len + end - start), dtype=torch.bool, device=device).tril(prefix_len)
    return PrefillChunk(start, end, prefix_len, torch.tensor(block_ids, dtype=torch.long, device=device), mask)


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] long, cache slot (block * block_size + offset) per token
    block_size: int
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    prefill_batch: PrefillBatch | None = None  # the kernel path's view of `prefills`, built on first use


@dataclass(slots=True)
class PrefillBatch:
    """All prefill chunks of a step as the prefill kernel takes them (rows start..end of the batch)."""

    start: int
    end: int
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with block 0
    cu_seqlens_q: torch.Tensor  # [S + 1] int32, offsets from `start`
    context_lens: torch.Tensor  # [S] int32, cached prefix + chunk
    max_seqlen_q: int


def build_decode_groups(
    context_lens: list[int], block_tables: list[list[int]], block_size: int, device: torch.device
) -> list[DecodeGroup]:
    """decode_groups for decodes given as lists (tests, benchmarks): one group where the kernels run."""
    n = len(context_lens)
    width = max((len(t) for t in block_tables), default=0)
    table = np.zeros((n, max(width, 1)), dtype=np.int64)
    for r, t in enumerate(block_tables):
        table[r, : len(t)] = t
    return decode_groups(np.asarray(context_lens, dtype=np.int64), table, np.arange(n), block_size, device,
                         one_group=dispatch.use_triton(device))


def decode_groups(context_lens: np.ndarray, block_table: np.ndarray, rows: np.ndarray, block_size: int,
                  device: torch.device, *, one_group: bool, int32: bool = True) -> list[DecodeGroup]:
    """Decodes (sorted by context length unless `one_group`) as attention groups; their block tables are
    the rows `rows` of `block_table`, cut to the blocks the longest context covers.

    `one_group`: attention reads K/V through the tables (the C++ decode op, the Triton kernels), so one
    group of every decode, no mask; `int32` tables and lengths for the Triton kernels (the C++ op takes
    int64 as it comes). Else (the torch path, which gathers whole blocks) groups of similar length, so
    the gathered rows are padded little.
    """
    n = len(context_lens)
    if not n:
        return []
    width = -(-int(context_lens.max()) // block_size)
    tables = block_table[rows, :width]
    if one_group:
        if int32:
            tables, context_lens = tables.astype(np.int32), context_lens.astype(np.int32)
        return [DecodeGroup(0, n, _to(tables, device), None, _to(context_lens, device))]
    groups: list[DecodeGroup] = []
    lens_list = context_lens.tolist()
    i = 0
    while i < n:
        j = i + 1
        limit = max(lens_list[i] * DECODE_GROUP_SPREAD, lens_list[i] + block_size)
        while j < n and lens_list[j] <= limit:
            j += 1
        blocks = -(-lens_list[j - 1] // block_size)
        table = torch.from_numpy(np.ascontiguousarray(tables[i:j, :blocks]))
        lens = torch.from_numpy(context_lens[i:j].astype(np.int32))
        mask = torch.arange(blocks * block_size)[None, :] < lens[:, None]
        groups.append(DecodeGroup(i, j, table.to(device), mask[:, None, None, :].to(device), lens.to(device)))
        i = j
    return groups


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)


def allocate_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                      device: torch.device | str, kv_cache_dtype: str = "auto") -> torch.Tensor:
    """One layer's key (or value) cache, zeroed: [blocks, block_size, Hkv, D] in `dtype` ("auto"), or the
    FP8 layout's uint8 rows [blocks, block_size, Hkv, D + 2] ("fp8")."""
    if kv_cache_dtype == "fp8":
        return kv_fp8.allocate(num_blocks, block_size, num_kv_heads, head_dim, device)
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype: must be 'auto' or 'fp8', got {kv_cache_dtype!r}")
    return torch.zeros((num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, device=device)


def _gather(cache: torch.Tensor, table: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[n, blocks] -> [n, blocks * block_size, kvh, d]: whole blocks as rows of the flattened cache.

    `index_select` copies each block as one row; advanced indexing (`cache[table]`) went element by
    element and was 2-3x slower."""
    num_blocks, bs, h, d = cache.shape
    n, b = table.shape
    rows = cache.view(num_blocks, bs * h * d)
    if out is None:
        out = rows.index_select(0, table.flatten())
    else:
        torch.index_select(rows, 0, table.flatten(), out=out)  # out: [n * blocks, bs * h * d]
    return out.view(n, b * bs, h, d)


def _decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, g: DecodeGroup,
                      scale: float) -> torch.Tensor:
    """One query per sequence, as two batched matmuls over the gathered K/V in cache layout.

    The gathered K/V are [n, L, kvh, d]. Rather than transposing them to [n, kvh, L, d] (a copy
    of every key, every layer), the queries go into a block-diagonal [n, heads, kvh * d] (head h
    non-zero only in its KV head's d columns) and multiply the keys flattened to [n, L, kvh * d]
    as they lie; the output keeps each head's own block. That costs kvh x the (tiny) attention
    arithmetic and saves the copies: 32 sequences x 150 keys, SmolLM2's 9/3 heads, bf16, it took
    0.6 ms a layer against 2.9 ms for gather-transpose-matmul, and a 32-sequence decode step of
    the real model went from 140 to 111 ms; `python -m benchmarks.kernels paged_attention` times
    it against the reference and SDPA. Past 4 KV heads the waste outgrows the saving and the
    keys are transposed instead.
    """
    n, num_heads, head_dim = q.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    if g.workspace is None:
        rows = (g.block_tables.numel(), key_cache[0].numel())
        g.workspace = (key_cache.new_empty(rows), value_cache.new_empty(rows))
    k = _gather(key_cache, g.block_tables, out=g.workspace[0])
    v = _gather(value_cache, g.block_tables, out=g.workspace[1])
    if kv_fp8.is_fp8(key_cache):
        k, v = kv_fp8.dequantize(k, q.dtype), kv_fp8.dequantize(v, q.dtype)
    length = k.shape[1]
    if n <= FLOAT32_DECODE_ROWS and q.dtype != torch.float32:
        # A few sequences (batch-1 decode): 16-bit batched matmuls this small run far below the
        # matmul's speed (oneDNN's per-call cost), float32 ones do not, and the K/V copies to widen
        # stay small. 9/3 heads, bf16, one thread: 52 against 81 us a layer at 150 keys, 190 against
        # 329 at 600. Scores and probabilities stay float32 (no rounding to bf16 between the matmuls).
        kf, vf = k.float(), v.float()
        qg = q.float().view(n, num_kv_heads, group, head_dim)
        scores = torch.einsum("nhgd,nlhd->nhgl", qg, kf).mul_(scale)  # [n, kvh, group, L]
        scores.masked_fill_(~g.mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.einsum("nhgl,nlhd->nhgd", probs, vf).reshape(n, num_heads, head_dim).to(q.dtype)
    if num_kv_heads > 4:
        qg = q.view(n, num_kv_heads, group, head_dim)
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [n, kvh, L, d]
        scores = torch.matmul(qg, kt.transpose(-1, -2)).float() * scale  # [n, kvh, group, L]
        scores.masked_fill_(~g.mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, vt).view(n, num_heads, head_dim)
    qbd = q.new_zeros(n, num_kv_heads, num_kv_heads, group, head_dim)  # [n, key block, kv head, group, d]
    qv = q.view(n, num_kv_heads, group, head_dim)
    for i in range(num_kv_heads):
        qbd[:, i, i] = qv[:, i]
    qbd = qbd.view(n, num_kv_heads, num_heads, head_dim).transpose(1, 2).reshape(n, num_heads, num_kv_heads * head_dim)
    scores = torch.bmm(qbd, k.view(n, length, -1).transpose(1, 2)).float().mul_(scale)  # [n, heads, L]
    scores.masked_fill_(~g.mask.view(n, 1, length), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    o = torch.bmm(probs, v.view(n, length, -1)).view(n, num_kv_heads, group, num_kv_heads, head_dim)
    return torch.stack([o[:, i, :, i] for i in range(num_kv_heads)], 1).view(n, num_heads, head_dim)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] (this step's, already written to the cache) -> [T, H * D]."""
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    for g in meta.decode_groups:
        out[g.start : g.end] = _decode_attention(q[g.start : g.end], key_cache, value_cache, g, scale)
    _prefill_attention(q, k, v, key_cache, value_cache, meta, scale, out)
    return out.view(num_tokens, num_heads * head_dim)


def paged_attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """paged_attention with the decodes in one C++ call per group (kernels/cpu_decode.py): it reads
    keys and values through the block table where they lie, no gather, mask or block-diagonal query
    (about 20 torch ops a layer at batch 1). Prefill chunks as paged_attention runs them."""
    num_tokens, num_heads, head_dim = q.shape
    if not meta.prefills and len(meta.decode_groups) == 1:  # a decode-only step of similar lengths: no copy
        g = meta.decode_groups[0]
        return cpu_decode.paged_decode_attention(q, key_cache, value_cache, g.block_tables, g.context_lens,
                                                 scale).view(num_tokens, num_heads * head_dim)
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    for g in meta.decode_groups:
        out[g.start : g.end] = cpu_decode.paged_decode_attention(
            q[g.start : g.end], key_cache, value_cache, g.block_tables, g.context_lens, scale)
    _prefill_attention(q, k, v, key_cache, value_cache, meta, scale, out)
    return out.view(num_tokens, num_heads * head_dim)


def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, meta: AttentionMetadata, scale: float, out: torch.Tensor) -> None:
    """Each prefill chunk against its cached prefix and itself, into its rows of out [T, H, D]."""
    for p in meta.prefills:
        qp = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, H, Q, D]
        if p.prefix_len == 0:
            # Nothing cached before the chunk: attend to this step's K/V directly, no gather.
            kp, vp = k[p.start : p.end], v[p.start : p.end]
            if kv_fp8.is_fp8(key_cache):
                kp, vp = kv_fp8.dequantize(kv_fp8.quantize(kp), q.dtype), kv_fp8.dequantize(kv_fp8.quantize(vp), q.dtype)
            kp, vp = kp.transpose(0, 1).unsqueeze(0), vp.transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)
        else:
            ctx = p.prefix_len + (p.end - p.start)
            kp = kv_fp8.readable(_gather(key_cache, p.block_ids[None]), q.dtype).transpose(1, 2)[:, :, :ctx]
            vp = kv_fp8.readable(_gather(value_cache, p.block_ids[None]), q.dtype).transpose(1, 2)[:, :, :ctx]
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, scale=scale, enable_gqa=True)
        out[p.start : p.end] = o.squeeze(0).transpose(0, 1)


def _prefill_batch(prefills: list[PrefillChunk], device: torch.device) -> PrefillBatch:
    width = max(len(p.block_ids) for p in prefills)
    table = torch.zeros((len(prefills), width), dtype=torch.int32)
    cu, lens = [0], []
    for i, p in enumerate(prefills):
        table[i, : len(p.block_ids)] = p.block_ids.cpu().to(torch.int32)
        if p.start != prefills[0].start + cu[-1]:
            raise ValueError("prefill chunks must be contiguous rows of the batch")
        cu.append(cu[-1] + p.end - p.start)
        lens.append(p.prefix_len + p.end - p.start)
    return PrefillBatch(prefills[0].start, prefills[-1].end, table.to(device),
                        torch.tensor(cu, dtype=torch.int32).to(device), torch.tensor(lens, dtype=torch.int32).to(device),
                        max(p.end - p.start for p in prefills))


def paged_attention_kernels(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """paged_attention through kernels.dispatch: one decode launch per group (one group when built for
    the kernels) and one prefill launch for all chunks. k and v are read back from the cache (the
    arguments are unused: None where models.layers.NeoxRotary.rotate_write_kv wrote them)."""
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    for g in meta.decode_groups:
        lens = g.context_lens
        if lens is None:  # groups made by hand without lengths
            lens = g.mask.reshape(g.end - g.start, -1).sum(-1, dtype=torch.int32)
        out[g.start : g.end] = dispatch.paged_decode_attention(
            q[g.start : g.end], key_cache, value_cache, g.block_tables.to(torch.int32), lens, scale)
    if meta.prefills:
        if meta.prefill_batch is None:  # once per step, shared by every layer
            meta.prefill_batch = _prefill_batch(meta.prefills, q.device)
        b = meta.prefill_batch
        out[b.start : b.end] = dispatch.prefill_attention(
            q[b.start : b.end], key_cache, value_cache, b.block_tables, b.cu_seqlens_q, b.context_lens, scale,
            max_seqlen_q=b.max_seqlen_q)
    return out.view(num_tokens, num_heads * head_dim)
