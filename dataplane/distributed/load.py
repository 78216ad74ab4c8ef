"""Build one rank's shard of a model from the full weights (the loader's own path on sliced tensors)."""

from __future__ import annotations

import torch

from dataplane.config import ModelConfig
from dataplane.distributed.group import CommStats, make_row_parallel
from dataplane.distributed.shard import shard_args, shard_weights
from dataplane.models.config import LlamaArgs
from dataplane.models.llama import LlamaModel
from dataplane.models.loader import build_llama


def check_supported(mc: ModelConfig) -> None:
    """What a tensor-parallel engine does not do yet, refused before any process starts."""
    if mc.quantization is not None:
        # Pre-quantized checkpoints (AWQ) hold packed tensors under other names than shard.py slices.
        raise ValueError(f"quantization: {mc.quantization!r} is not supported with tensor_parallel_size > 1 "
                         "(dense weights only)")


def build_shard(args: LlamaArgs, tensors: dict[str, torch.Tensor], mc: ModelConfig, rank: int,
                device: str) -> tuple[LlamaModel, CommStats]:
    """Rank `rank`'s model: its heads and MLP columns, o/down summed over the group (group.AllReduceLinear)."""
    size = mc.tensor_parallel_size
    model = build_llama(shard_args(args, size), shard_weights(args, tensors, rank, size), mc.torch_dtype,
                        torch.device(device), weight_dtype=mc.torch_weight_dtype)
    return model, make_row_parallel(model)
