"""Plain-torch twins of the Triton kernels: same signatures, same results within rounding.

They are the definition the kernels are tested against, and the path the engine runs on
the CPU, so they compute in float32, vectorize where that is simple, and avoid per-token
Python loops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.awq_layout import awq_dequantize
from kernels.gguf_layout import q4_1_fields, q8_0_fields
from kernels.kv_fp8 import is_fp8, quantize, readable, row_bytes
from kernels.seeded_noise import seeded_noise_at

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448


# --- attention -------------------------------------------------------------------------------


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """[num_tokens, num_kv_heads, head_dim] of one sequence, read through its block table."""
    block_size = cache.shape[1]
    num_blocks = -(-num_tokens // block_size)
    blocks = cache[block_table[:num_blocks].long()]  # [blocks, block_size, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:num_tokens]


def paged_decode_attention_ref(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,  # the kernel's tuning knob; no meaning here
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    max_ctx = int(context_lens.max()) if num_seqs else 0
    if max_ctx == 0:
        return torch.zeros_like(q)
    num_blocks = -(-max_ctx // block_size)
    table = block_tables[:, :num_blocks].long()
    # [S, blocks, block_size, Hkv, D] → [S, Hkv, T, D], padded to the longest context; an FP8
    # cache (kernels/kv_fp8.py) dequantized as gathered.
    k = readable(key_cache[table]).flatten(1, 2)[:, :max_ctx].transpose(1, 2).float()
    v = readable(value_cache[table]).flatten(1, 2)[:, :max_ctx].transpose(1, 2).float()
    qg = q.float().reshape(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [S, Hkv, group, T]
    valid = torch.arange(max_ctx, device=q.device)[None, :] < context_lens[:, None].to(q.device)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty context gives zeros
    out = torch.matmul(probs, v).reshape(num_seqs, num_heads, head_dim)
    return out.to(q.dtype)


def prefill_attention_ref(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_seqlen_q: int | None = None,  # the kernel's grid size; no meaning here
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix plus themselves."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for seq, ctx in enumerate(context_lens.tolist()):
        start, end = bounds[seq], bounds[seq + 1]
        q_len = end - start
        if q_len == 0:
            continue
        prefix = ctx - q_len
        k = readable(gather_kv(key_cache, block_tables[seq], ctx)).float().transpose(0, 1)  # [Hkv, ctx, D]
        v = readable(gather_kv(value_cache, block_tables[seq], ctx)).float().transpose(0, 1)
        qs = q[start:end].float().transpose(0, 1).reshape(num_kv_heads, group * q_len, head_dim)
        scores = torch.matmul(qs, k.transpose(-1, -2)).reshape(num_kv_heads, group, q_len, ctx) * scale
        query_pos = prefix + torch.arange(q_len, device=q.device)
        allowed = torch.arange(ctx, device=q.device)[None, :] <= query_pos[:, None]
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        o = torch.matmul(probs.reshape(num_kv_heads, group * q_len, ctx), v)  # [Hkv, group*q, D]
        out[start:end] = o.reshape(num_heads, q_len, head_dim).transpose(0, 1).to(q.dtype)
    return out


# --- normalization, rotary, activation -------------------------------------------------------


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual); new_residual is x + residual, or x when residual is None.

    Rounds where Hugging Face's LlamaRMSNorm rounds (the sum and the normalized value are cast
    to the input dtype before the weight multiply), so bf16 outputs match transformers bit for bit.
    """
    if residual is not None:
        x = x + residual  # torch adds half types in float32 and rounds once, as the kernel does
    # F.rms_norm's fused CPU kernel: 1.5x faster than the spelled-out mean/rsqrt at 32 x 576 bf16
    # (24 vs 37 us, one thread), with the same results.
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
    return (normed * weight).to(x.dtype), x


def rotary_embedding_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX / HF ``rotate_half`` rotary: x·cos + rotate_half(x)·sin on [T, heads, head_dim]."""
    cos = cos_cache[positions.long()].float()[:, None, :]
    sin = sin_cache[positions.long()].float()[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def write_kv_ref(
    key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store K/V rows [T, kv_heads, head_dim] at their cache slots (block * block_size + offset), quantized
    for an FP8 cache (kernels/kv_fp8.py)."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    if is_fp8(key_cache):
        row = row_bytes(head_dim)
        key_cache.view(-1, num_kv_heads, row).index_copy_(0, slots, quantize(k))
        value_cache.view(-1, num_kv_heads, row).index_copy_(0, slots, quantize(v))
        return
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def rotary_write_kv_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """q [T, H, D] rotated from a fused qkv output [T, (H + 2 Hkv) D]; k rotated and v stored at `slots`
    of the caches (write_kv_ref). The rotated k is not returned: the kernel path reads it from the cache."""
    n, d = qkv.shape[0], qkv.shape[1] // (heads + 2 * kv_heads)
    q = qkv[:, : heads * d].view(n, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d)
    q, k = rotary_embedding_ref(q, k, positions, cos_cache, sin_cache)
    write_kv_ref(key_cache, value_cache, k, qkv[:, (heads + kv_heads) * d :].view(n, kv_heads, d), slots.long())
    return q


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] → [T, I]: silu(gate) * up, gate the first half as a fused gate_up projection writes it."""
    half = x.shape[-1] // 2
    return (F.silu(x[..., :half].float()) * x[..., half:].float()).to(x.dtype)


# --- sampling --------------------------------------------------------------------------------


def sample_top_k_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    k: int,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    noise: torch.Tensor,
    seeds: torch.Tensor | None,
    index: torch.Tensor | None,
) -> torch.Tensor:
    """One token per row of float32 logits [R, V], drawn among the row's top-k candidates.

    temperature [R] > 0 scales the logits; `k` candidates per row (sorted, best first, from one topk);
    top_k [R] in [1, k] keeps fewer for some rows (None: every row keeps k); top_p [R] keeps the
    candidates before which less than top_p of the whole vocabulary's mass lies (the best always stays);
    min_p [R] drops candidates below min_p times the best's probability. The draw is the exponential
    race, argmax of weight / noise: noise [R, k] is Exp(1) for unseeded rows; a row with seeds [R] >= 0
    (-1: unseeded; None: none is) uses the hash of (seed, index [R], token id) instead
    (kernels/seeded_noise.py), so its token depends on nothing else. Returns int64 ids [R].
    """
    scaled = logits / temperature[:, None]
    values, ids = scaled.topk(k, dim=-1)  # sorted, best first
    best = values[:, :1]
    weights = torch.exp(values - best)
    drop = None
    if top_k is not None:
        drop = torch.arange(k, device=logits.device)[None, :] >= top_k[:, None]
    if top_p is not None:
        # each candidate's share of the whole vocabulary's mass (exp relative to the best: no overflow)
        probs = weights / torch.exp(scaled - best).sum(dim=-1, keepdim=True)
        # the mass before a candidate reaches top_p; before the best it is 0 < top_p, so the best stays
        over = (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        drop = over if drop is None else drop | over
    if min_p is not None:
        low = values < best + torch.log(min_p)[:, None]
        drop = low if drop is None else drop | low
    if drop is not None:
        weights = weights.masked_fill(drop, 0.0)
    if seeds is not None:  # every row hashed, the seeded ones kept: no host sync to find them
        noise = torch.where((seeds >= 0)[:, None], seeded_noise_at(seeds, index, ids), noise)
    choice = (weights / noise).argmax(dim=-1, keepdim=True)
    return ids.gather(1, choice).squeeze(1)


def top_k_top_p_mask(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Logits outside each row's top-k and top-p nucleus set to -inf (the most likely token always stays).
    top_k 0 (or >= vocab) and top_p 1 leave a row whole. The nucleus's mass is the whole vocabulary's."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab)
        drop |= torch.arange(vocab, device=logits.device)[None, :] >= k[:, None]
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass before it already reaches top_p.
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, -float("inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample_full_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    noise: torch.Tensor,
) -> torch.Tensor:
    """One token per row of float32 logits [R, V], drawn over the whole vocabulary: for rows whose top_k
    (0: off) is not small enough for sample_top_k_ref, or that have none.

    temperature [R] > 0; top_k [R] (0: off), top_p [R] (1: off) and min_p [R] (0: off) as in
    sample_top_k_ref, each None where no row uses it. The exponential race over Exp(1) noise [R, V], the
    caller's: drawn, or for a seeded row the hash of its (seed, output index, token id)
    (kernels/seeded_noise.py), with which a seeded row draws what sample_top_k_ref draws for it where
    both apply. The C++ twin (kernels/cpu_sample.sample_full) takes seeds and indices instead and hashes
    every row's noise itself: its tokens are this function's for noise = seeded_noise(seeds, index, V).
    Returns int64 ids [R].
    """
    scaled = logits / temperature[:, None]
    if top_k is not None or top_p is not None:
        scaled = top_k_top_p_mask(scaled, top_k, top_p)
    probs = torch.softmax(scaled, dim=-1)
    if min_p is not None:
        floor = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
        probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
    return (probs / noise).argmax(dim=-1)


# --- LoRA ------------------------------------------------------------------------------------


def segments_to_token_ids(seg_indptr: torch.Tensor, seg_lora_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Per-token adapter ids from segments; tokens outside every segment get -1."""
    ids = torch.full((num_tokens,), -1, dtype=torch.int32, device=seg_lora_ids.device)
    lengths = (seg_indptr[1:] - seg_indptr[:-1]).long()
    start, end = int(seg_indptr[0]), int(seg_indptr[-1])
    ids[start:end] = torch.repeat_interleave(seg_lora_ids.to(torch.int32), lengths)
    return ids


def bgmv_shrink_ref(
    x: torch.Tensor, lora_a: torch.Tensor, scaling: torch.Tensor, token_lora_ids: torch.Tensor
) -> torch.Tensor:
    """[T, in] → float32 [T, rank]: scaling[slot] · x A[slot]^T per token, zeros where the id is -1."""
    out = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    for slot in token_lora_ids.unique().tolist():  # a handful of adapters, not one loop per token
        if slot < 0:
            continue
        rows = token_lora_ids == slot
        out[rows] = (x[rows].float() @ lora_a[slot].float().t()) * float(scaling[slot])
    return out


def bgmv_expand_ref(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    token_lora_ids: torch.Tensor,
    col_offset: int = 0,
) -> torch.Tensor:
    """y[:, col_offset:col_offset+out] += buf B[slot]^T per token, in place; returns y."""
    cols = slice(col_offset, col_offset + lora_b.shape[1])
    for slot in token_lora_ids.unique().tolist():
        if slot < 0:
            continue
        rows = (token_lora_ids == slot).nonzero().squeeze(1)
        delta = buf[rows].float() @ lora_b[slot].float().t()
        y[rows, cols] = (y[rows, cols].float() + delta).to(y.dtype)
    return y


def sgmv_shrink_ref(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    scaling: torch.Tensor,
    seg_indptr: torch.Tensor,
    seg_lora_ids: torch.Tensor,
    *,
    max_seg_len: int | None = None,  # the kernel's grid size; no meaning here
) -> torch.Tensor:
    ids = segments_to_token_ids(seg_indptr, seg_lora_ids, x.shape[0])
    return bgmv_shrink_ref(x, lora_a, scaling, ids)


def sgmv_expand_ref(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    seg_indptr: torch.Tensor,
    seg_lora_ids: torch.Tensor,
    col_offset: int = 0,
    *,
    max_seg_len: int | None = None,
) -> torch.Tensor:
    ids = segments_to_token_ids(seg_indptr, seg_lora_ids, y.shape[0])
    return bgmv_expand_ref(y, buf, lora_b, ids, col_offset)


# --- quantized GEMMs -------------------------------------------------------------------------


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] e4m3 · weight_scale [N])^T → [M, N] in x's dtype."""
    w = weight.float() * weight_scale.float()[:, None]
    return (x.float() @ w.t()).to(x.dtype)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row e4m3 quantization: (x_fp8 [M, K], scale float32 [M, 1]), x ≈ x_fp8 · scale."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    x_fp8 = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return x_fp8, scale


def fp8_w8a8_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The W8A8 result: activations quantized per token to e4m3, exact products, float32 sums."""
    x_fp8, x_scale = quantize_fp8_per_token(x)
    return fp8_linear_ref((x_fp8.float() * x_scale).to(torch.float32), weight, weight_scale).to(x.dtype)


def awq_gemm_ref(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int = 128,
) -> torch.Tensor:
    """x [M, K] @ dequantized AWQ weight [K, N] → [M, N] in x's dtype."""
    w = awq_dequantize(qweight, qzeros, scales, group_size)
    return (x.float() @ w).to(x.dtype)


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.Linear weight [N, K] → (e4m3 [N, K], float32 scale [N]) with weight ≈ w_fp8 · scale[:, None]."""
    amax = weight.abs().amax(dim=1).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    w_fp8 = (weight.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return w_fp8, scale


# --- GGUF blocks on the CPU (kernels/gguf_cpu.py; layout in kernels/gguf_layout.py) ------------


def quantize_q8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, K] -> (q float32 [rows, K/32, 32] integers in -127..127, d [rows, K/32]): llama.cpp's
    8-bit activation blocks, d = amax / 127 and q = round-half-even(x / d), in float32."""
    xb = x.float().reshape(x.shape[0], -1, 32)
    d = xb.abs().amax(-1) / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    return torch.round(xb * inv[..., None]), d


def gguf_q4_1_linear_ref(x: torch.Tensor, blocks: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """The kernel's arithmetic: 8-bit activation blocks against the Q4_1 integers, per block
    d_w d_x sum(q_w q_x) + m_w d_x sum(q_x), in float32 (the integer sums exact)."""
    qx, dx = quantize_q8_rows(x)
    qw, d, m = q4_1_fields(blocks, in_features)
    isum = torch.einsum("rbk,obk->rob", qx.double(), qw.double()).float()  # [rows, out, blocks]
    y = (isum * d[None] * dx[:, None]).sum(-1) + ((dx * qx.sum(-1))[:, None] * m[None]).sum(-1)
    return y.to(x.dtype)


def gguf_q8_0_linear_ref(x: torch.Tensor, blocks: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """The kernel's arithmetic for Q8_0: d_w d_x sum(q_w q_x) per block, in float32."""
    qx, dx = quantize_q8_rows(x)
    qw, d = q8_0_fields(blocks, in_features)
    isum = torch.einsum("rbk,obk->rob", qx.double(), qw.double()).float()
    return (isum * d[None] * dx[:, None]).sum(-1).to(x.dtype)
