"""The messages of a tensor parallel engine's ranks (distributed/launch.py sends, distributed/follower.py
receives): plain dataclasses, pickled. Their own module, at the models' layer, so rank 0's side imports
them without importing the follower's loop, which runs the engine's decode graphs (runner/)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dataplane.config import ModelConfig
from dataplane.distributed.group import RankInfo
from dataplane.models.attention import AttentionMetadata


@dataclass(slots=True)
class Step:
    """One forward pass, as rank 0 runs it. `None` in its place tells the followers to exit."""

    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    meta: AttentionMetadata  # built once by rank 0's runner, before any layer ran
    num_blocks: int  # KV blocks per layer: the follower allocates its cache shard on the first step
    block_size: int
    kv_cache_dtype: str = "auto"  # the engine's CacheConfig.kv_cache_dtype: the shard is allocated alike


@dataclass(slots=True)
class GraphStep:
    """A decode-only step through every rank's DecodeGraphs (runner/decode_graphs.py): each rank copies
    these rows into its persistent buffers and replays its graph of the padded size (on CUDA the NCCL
    all-reduces are inside the graphs), or, with `capture` set, captures that size, as rank 0 does at the
    same moment: the collectives of a capture and of its warm-up must pair up across the ranks."""

    mode: str  # 'cuda' (captured graphs) or 'padded' (the same padded step, eagerly)
    max_num_seqs: int  # rank 0's DecodeGraphs' sizes, buffers and dummy block, built alike here
    table_width: int
    dummy_block: int
    num_blocks: int  # KV blocks per layer and their size: the cache shard, when it is not allocated yet
    block_size: int
    kv_cache_dtype: str
    capture: int | None = None  # capture this padded size now (no rows)
    input_ids: np.ndarray | None = None  # [n] the step's rows, as DecodeGraphs.run takes them
    positions: np.ndarray | None = None
    slots: np.ndarray | None = None
    tables: np.ndarray | None = None  # [n, width] the rows' block tables
    context_lens: np.ndarray | None = None


@dataclass(slots=True)
class FollowerSpec:
    """What rank 0 hands a follower on its stdin (pickled)."""

    model_config: ModelConfig
    info: RankInfo
    port: int  # rank 0's rendezvous port on 127.0.0.1
    threads: int  # torch intra-op threads
    parent_pid: int  # rank 0's process: the follower exits when it is gone
