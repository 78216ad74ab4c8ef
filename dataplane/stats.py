"""Engine statistics: a snapshot the worker turns into Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TierStats:
    """The prefix cache's second tier (kv_cache/second_tier.py)."""

    held_blocks: int = 0  # blocks held now
    held_bytes: int = 0  # their bytes (payload and header)
    capacity_bytes: int = 0
    saved_blocks: int = 0  # cumulative: blocks written (first-tier evictions kept, blocks received)
    saved_bytes: int = 0
    loaded_blocks: int = 0  # cumulative: blocks read back (second-tier hits, blocks exported)
    loaded_bytes: int = 0
    load_seconds: float = 0.0  # cumulative: reading and verifying them
    failed_loads: int = 0  # cumulative: entries missing or corrupt at load (their tokens were recomputed)
    failed_saves: int = 0  # cumulative: writes that failed (disk full, ...): the block is simply not kept
    evicted_blocks: int = 0  # cumulative: entries dropped for the byte cap


@dataclass(slots=True)
class SchedulerStats:
    num_running: int  # requests holding KV blocks
    num_waiting: int  # queued, including preempted ones
    kv_cache_usage: float  # fraction of blocks in use, 0..1
    prefix_cache_queries: int  # cumulative tokens looked up in the prefix cache
    prefix_cache_hits: int  # cumulative tokens found
    num_preemptions: int  # cumulative
    prompt_tokens: int  # cumulative prompt tokens computed (cache hits excluded)
    generation_tokens: int  # cumulative tokens sampled
    num_blocks: int  # KV blocks in the pool
    num_free_blocks: int  # blocks neither in use nor held by a live request
    num_paused: int = 0  # background requests (running, blocks held) sitting out while online work runs
    spec_num_drafts: int = 0  # cumulative: verify steps with at least one draft token (speculative decoding)
    spec_num_draft_tokens: int = 0  # cumulative draft tokens proposed
    spec_num_accepted_tokens: int = 0  # cumulative draft tokens the model agreed with
    # decode-only steps as CUDA graphs (runner/decode_graphs.py); zeros when the engine runs eagerly
    cuda_graphs: int = 0  # graphs captured
    cuda_graph_capture_seconds: float = 0.0  # wall time the capture took
    cuda_graph_memory_bytes: int = 0  # device memory of the graphs' shared pool
    cuda_graph_replays: int = 0  # cumulative decode steps served by a graph
    kv_offload: TierStats | None = None  # the prefix cache's second tier (a copy); None when there is none
