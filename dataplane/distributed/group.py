"""The process group of one tensor-parallel engine, and the row-parallel projection that sums over it."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(slots=True)
class RankInfo:
    rank: int
    size: int
    device: str  # this rank's device: "cpu", or "cuda:<rank>"
    backend: str  # gloo on CPU, nccl on CUDA (objects always travel on a gloo group)


def rank_device(device: str, rank: int) -> str:
    """Rank r's device: the CPU for all of them, or the r-th GPU."""
    return "cpu" if str(device).startswith("cpu") else f"cuda:{rank}"


def rendezvous_store(size: int, timeout_s: float) -> Any:
    """Rank 0's rendezvous server on a port the OS picks, bound before any follower starts: a port
    found free and bound later could be taken in between (it happened on a busy host)."""
    return dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                         timeout=dt.timedelta(seconds=timeout_s))


def init_group(info: RankInfo, port: int, timeout_s: float, store: Any = None) -> Any:
    """Join the group (all ranks must call this); returns the gloo group step messages travel on.

    `timeout_s` bounds each collective on this rank: rank 0 uses a short one so a rank that died
    mid-step fails the step instead of hanging it; the others wait for the next step as long as
    the engine idles, and a watchdog ends them if rank 0 goes (follower.py)."""
    if info.device.startswith("cuda"):
        torch.cuda.set_device(info.device)
    if store is None:  # a follower: a client of rank 0's store (both sides pass a store: same key names)
        store = dist.TCPStore("127.0.0.1", port, info.size, is_master=False, timeout=dt.timedelta(seconds=120))
    dist.init_process_group(info.backend, rank=info.rank, world_size=info.size, store=store,
                            timeout=dt.timedelta(seconds=timeout_s))
    if info.backend == "gloo":
        return dist.group.WORLD
    # NCCL moves tensors between GPUs; pickled step messages go host to host on gloo (as vLLM does).
    return dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout_s))


@dataclass(slots=True)
class CommStats:
    """Where a rank's step time goes beyond its own maths (benchmarks/tensor_parallel.py reads it)."""

    all_reduces: int = 0
    all_reduce_seconds: float = 0.0  # waiting for the slowest rank included: the price of the split
    broadcasts: int = 0
    broadcast_seconds: float = 0.0


_WIDEN = (torch.bfloat16, torch.float16)


class AllReduceLinear:
    """A row-parallel projection: this rank's partial product, summed over the ranks in place.

    Wraps the loader's projection (dense, packed or quantized alike) and reads through to it for
    the attributes others inspect (weight_bytes, weight)."""

    __slots__ = ("inner", "stats")

    def __init__(self, inner: Any, stats: CommStats) -> None:
        self.inner = inner
        self.stats = stats

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        t0 = time.perf_counter()
        if y.dtype in _WIDEN and y.device.type == "cpu":
            # Summed in float32 on the CPU: a 16-bit sum of rounded partial products rounds once more
            # than one process's matmul, and flipped greedy near-ties (SmolLM2 bf16, 8 prompts x 16
            # tokens: 5 of 8 identical to one process summed in bf16, 6 of 8 widened). Gloo's cost is
            # latency, not bytes; NCCL keeps the model dtype (half the bytes, as vLLM does).
            wide = y.float()
            dist.all_reduce(wide)
            y = wide.to(y.dtype)
        else:
            dist.all_reduce(y)
        self.stats.all_reduce_seconds += time.perf_counter() - t0
        self.stats.all_reduces += 1
        return y

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def make_row_parallel(model: Any) -> CommStats:
    """Sum o_proj's and down_proj's partial outputs across ranks: the only collectives in a layer."""
    stats = CommStats()
    for layer in model.layers:
        layer.o_proj = AllReduceLinear(layer.o_proj, stats)
        layer.down_proj = AllReduceLinear(layer.down_proj, stats)
    return stats


def move(obj: Any, device: str) -> Any:
    """A copy of a step message (tensors in lists, tuples and slot dataclasses) with its tensors on `device`."""
    if isinstance(obj, torch.Tensor):
        return obj if str(obj.device) == device else obj.to(device)
    if isinstance(obj, list | tuple):
        return type(obj)(move(x, device) for x in obj)
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields:
        return type(obj)(**{name: move(getattr(obj, name), device) for name in fields})
    return obj
