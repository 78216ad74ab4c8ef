"""The whole-vocabulary draw in one launch: temperature, top-k, top-p, min-p and the exponential race,
with every row's noise hashed in the kernel. Twin of `cpu_sample.sample_full` (C++, the CPU's) and of
`reference.sample_full_ref` for noise = seeded_noise(seeds, index, V).

In torch a GPU ran this as a sort of the vocabulary (for top-k / top-p), a softmax, a cumsum, masks, an
Exp(1) tensor [R, V] and an argmax: about 20 launches and an [R, V] sort. Here one program per row reads
its logits a few times and writes one id:

1. the row's largest logit, and (for top-p) the mass sum of e^(x/t - best) over the row;
2. the race over every token min-p keeps: argmax of e^(x/t - best) / noise(id), the lowest id on a tie;
3. is the winner in the row's top-k and top-p nucleus? One pass counts the tokens ranked before it (a
   larger logit, or an equal one with a lower id: the C++ twin's order) and their mass, and runs the
   race again among them. A winner with fewer than top_k ranked before it and less than top_p of the
   mass before it (or none at all before it: the best always stays) is the draw; else the new race's
   winner is the next candidate, and so on.

Why that is exact: the reference keeps a prefix N of the ranking and races over it. Every candidate set
here is "the tokens ranked before the last winner", which holds N as long as that winner was outside N;
a race won inside N over a superset of N is the race over N (same noise, same scores). Each round removes
at least the previous winner, and with a peaked row the first winner is usually inside the nucleus; a
flat row with a small top_k takes ~log2(V / top_k) rounds, each one pass over the row.

Same tokens as the twins for the same seeds and indices, except where two tokens' scores agree to the
rounding of exp and log (each library rounds its own) or a nucleus boundary falls within summation
rounding of top_p.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_devices, check_shape, check_tensor, fail


@triton.jit
def _noise_stream(seed, index):
    """kernels/seeded_noise.py's per-(seed, output index) stream: splitmix64's finalizer, low word."""
    x = seed.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15 + index.to(tl.uint64, bitcast=True)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    x = x ^ (x >> 31)
    return x.to(tl.uint32)


@triton.jit
def _noise(stream, ids):
    """Exp(1) noise at token ids (int32 tile): murmur3's finalizer over the stream, 23 bits -> (0, 1)."""
    x = stream ^ (ids.to(tl.uint32) * 0x9E3779B9)
    x = (x ^ (x >> 16)) * 0x85EBCA6B
    x = (x ^ (x >> 13)) * 0xC2B2AE35
    x = x ^ (x >> 16)
    return -tl.log(((x >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0))


@triton.jit
def _race(x, ids, allowed, t, best, floor, stream, start):
    """The race on one tile: (its best score, the lowest id reaching it) over the `allowed` tokens that
    min-p keeps, score e^(x/t - best) / noise(id); also the tile's e^(x/t - best)."""
    v = x / t
    d = v - best
    e = tl.exp(d)
    w = tl.where(allowed & (v >= floor) & (d >= -87.0), e, 0.0)  # past -87 e^d is no normal float: out
    score = w / _noise(stream, ids)
    return tl.max(score, axis=0), tl.argmax(score, axis=0).to(tl.int32) + start, e


@triton.jit
def _sample_full_kernel(
    out_ptr,  # [R] int64 drawn token ids
    logits_ptr,  # [R, V] float32, unit stride along V
    temperature_ptr,  # [R] float32 > 0
    top_k_ptr,  # [R] int64, 0: off (read only when HAS_TOP_K)
    top_p_ptr,  # [R] float32, 1: off (read only when HAS_TOP_P)
    min_p_ptr,  # [R] float32, 0: off (read only when HAS_MIN_P)
    seeds_ptr,  # [R] int64 >= 0: each row's noise stream with index
    index_ptr,  # [R] int64 output index of the row's request
    stride_row,  # logits' row stride
    vocab,  # V
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    BLOCK: tl.constexpr,  # tokens per tile, a power of two
):
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * stride_row
    t = tl.load(temperature_ptr + row)
    stream = _noise_stream(tl.load(seeds_ptr + row), tl.load(index_ptr + row))
    offs = tl.arange(0, BLOCK)

    # 1. the best logit (max(x) / t is max(x / t): dividing by t > 0 keeps the order), and the mass
    top = tl.full((), float("-inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        ids = start + offs
        x = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
        top = tl.maximum(top, tl.max(x, axis=0))
    best = top / t
    floor = float("-inf")
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row)
        floor = tl.where(min_p > 0.0, best + tl.log(min_p), float("-inf"))
    keep = vocab
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row)
        keep = tl.where((k > 0) & (k < vocab), k, vocab)
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row)
        total = tl.zeros((), tl.float32)
        for start in range(0, vocab, BLOCK):
            ids = start + offs
            x = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
            total += tl.sum(tl.where(ids < vocab, tl.exp(x / t - best), 0.0), axis=0)
        mass = total

    # 2. the race over every token min-p keeps
    choice = tl.zeros((), tl.int32)
    score_top = tl.full((), -1.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        ids = start + offs
        x = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
        tile_top, at, _ = _race(x, ids, ids < vocab, t, best, floor, stream, start)
        better = tile_top > score_top
        choice = tl.where(better, at, choice)
        score_top = tl.where(better, tile_top, score_top)

    # 3. until the winner is inside top-k and the nucleus: count and weigh what ranks before it, race again
    if HAS_TOP_K or HAS_TOP_P:
        done = False
        while not done:
            c = choice
            cv = tl.load(x_row + c)
            before_count = tl.zeros((), tl.int64)
            before_mass = tl.zeros((), tl.float32)
            next_choice = c
            next_top = tl.full((), -1.0, tl.float32)
            for start in range(0, vocab, BLOCK):
                ids = start + offs
                x = tl.load(x_row + ids, mask=ids < vocab, other=float("-inf"))
                ahead = (ids < vocab) & ((x > cv) | ((x == cv) & (ids < c)))
                tile_top, at, e = _race(x, ids, ahead, t, best, floor, stream, start)
                before_count += tl.sum(ahead.to(tl.int64), axis=0)
                if HAS_TOP_P:
                    before_mass += tl.sum(tl.where(ahead, e, 0.0), axis=0)
                better = tile_top > next_top
                next_choice = tl.where(better, at, next_choice)
                next_top = tl.where(better, tile_top, next_top)
            inside = before_count < keep
            if HAS_TOP_P:
                inside = inside & (before_mass / mass < top_p)
            done = (before_count == 0) | inside
            choice = tl.where(done, c, next_choice)
    tl.store(out_ptr + row, choice.to(tl.int64))


def sample_full(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                top_p: torch.Tensor | None, min_p: torch.Tensor | None, seeds: torch.Tensor,
                index: torch.Tensor) -> torch.Tensor:
    """One token per row of float32 logits [R, V]: `cpu_sample.sample_full`'s arguments and tokens (the
    noise of every row hashed from seeds [R] >= 0 and index [R]). temperature [R] > 0; top_k [R] int64 (0:
    off), top_p [R] (1: off), min_p [R] (0: off), each None where no row uses it. Returns int64 ids [R]."""
    op = "sample_full"
    check_tensor(op, "logits", logits, ndim=2, dtypes=(torch.float32,))
    rows, vocab = logits.shape
    if vocab >= 2**31:
        fail(op, f"a vocabulary of {vocab} tokens does not fit the kernel's int32 token ids")
    check_tensor(op, "temperature", temperature, ndim=1, dtypes=(torch.float32,), contiguous=True)
    check_shape(op, "temperature", temperature, [rows])
    for name, t, dtype in (("top_k", top_k, torch.int64), ("top_p", top_p, torch.float32),
                           ("min_p", min_p, torch.float32), ("seeds", seeds, torch.int64),
                           ("index", index, torch.int64)):
        if t is not None:
            check_tensor(op, name, t, ndim=1, dtypes=(dtype,), contiguous=True)
            check_shape(op, name, t, [rows])
    check_devices(op, [("logits", logits), ("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                       ("min_p", min_p), ("seeds", seeds), ("index", index)])
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    _sample_full_kernel[(rows,)](
        out, logits, temperature, top_k if top_k is not None else seeds, top_p if top_p is not None else temperature,
        min_p if min_p is not None else temperature, seeds, index, logits.stride(0), vocab,
        HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None, HAS_MIN_P=min_p is not None,
        # 4096 tokens a tile: a 49,152-token row in 12 tiles per pass; unmeasured on a GPU here
        BLOCK=min(4096, triton.next_power_of_2(vocab)), num_warps=8,
    )
    return out
