"""Which slice of each full weight a tensor-parallel rank keeps (Megatron's split of a Llama block).

Column-parallel (rows of W split, no communication): q, k, v by whole heads, gate and up by
intermediate rows. Row-parallel (columns of W split, outputs summed across ranks): o and down.
Norms, the embedding and the lm head stay whole on every rank: at SmolLM2's size the embedding is
28 M parameters that each rank reads once per step, and replicated logits need no gather, so only
rank 0 samples from them. The loader stays one path: it builds the model from the sliced tensors.
"""

from __future__ import annotations

import dataclasses

import torch

from dataplane.models.config import LlamaArgs

# Per-layer HF names and the dimension split: 0 = output rows (column-parallel), 1 = input columns (row-parallel).
_SPLITS = {
    "self_attn.q_proj.weight": 0,
    "self_attn.k_proj.weight": 0,
    "self_attn.v_proj.weight": 0,
    "mlp.gate_proj.weight": 0,
    "mlp.up_proj.weight": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.down_proj.weight": 1,
}


def check_tensor_parallel_size(args: LlamaArgs, size: int) -> None:
    """Refuse a split that would cut a head (or a KV head shared by several query heads) in two.

    KV heads are not replicated to make a size fit: each rank attends with whole KV heads of its own.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel_size: must be an integer >= 1, got {size!r}")
    if args.num_kv_heads % size or args.num_heads % size:
        fits = [n for n in range(1, args.num_kv_heads + 1) if args.num_kv_heads % n == 0 and args.num_heads % n == 0]
        raise ValueError(f"tensor_parallel_size: {size} does not divide the model's {args.num_heads} attention heads "
                         f"and {args.num_kv_heads} key/value heads; each rank must hold whole heads "
                         f"(sizes that fit: {', '.join(map(str, fits))})")
    if args.intermediate_size % size:
        raise ValueError(f"tensor_parallel_size: {size} does not divide the MLP's intermediate size "
                         f"{args.intermediate_size}")


def shard_args(args: LlamaArgs, size: int) -> LlamaArgs:
    """One rank's view: its heads and MLP width; hidden size, head_dim and vocabulary are whole."""
    check_tensor_parallel_size(args, size)
    return dataclasses.replace(args, num_heads=args.num_heads // size, num_kv_heads=args.num_kv_heads // size,
                               intermediate_size=args.intermediate_size // size)


def shard_weights(args: LlamaArgs, tensors: dict[str, torch.Tensor], rank: int,
                  size: int) -> dict[str, torch.Tensor]:
    """The tensors rank `rank` of `size` keeps, under the same HF names (copies: the full ones can go)."""
    check_tensor_parallel_size(args, size)
    if not 0 <= rank < size:
        raise ValueError(f"rank: must be in [0, {size}), got {rank}")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        dim = _SPLITS.get(name.split(".", 3)[-1]) if name.startswith("model.layers.") else None
        if dim is None:
            out[name] = t
            continue
        if t.shape[dim] % size:
            raise ValueError(f"{name}: dimension {dim} of {tuple(t.shape)} does not split into {size}")
        step = t.shape[dim] // size
        out[name] = t.narrow(dim, rank * step, step).contiguous()
    return out
