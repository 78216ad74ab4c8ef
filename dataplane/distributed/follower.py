"""Ranks 1..N-1 of a tensor-parallel engine: load a shard, then run each step rank 0 broadcasts.

A follower has no scheduler, sampler or tokenizer. Rank 0 sends each step's model input (token
ids, positions, attention metadata: the same arguments its own shard runs on) and the follower
runs its shard's forward, joining the two all-reduces per layer; its output is dropped, because
rank 0's hidden states are already the sum over all ranks. A decode-only step where rank 0 runs
decode graphs comes as a GraphStep instead: the follower keeps DecodeGraphs of its own and replays
(or captures) the same padded size. The KV cache of the follower's heads
lives here and follows the block ids rank 0's scheduler chose. The messages are distributed/messages.py;
this loop runs the runner's DecodeGraphs, so it stands at the engine's layer (tests/test_import_layers.py).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dataplane.distributed.group import init_group, move
from dataplane.distributed.load import build_shard
from dataplane.distributed.messages import FollowerSpec, GraphStep
from dataplane.models.attention import allocate_kv_cache
from dataplane.models.loader import read_weights
from dataplane.models.registry import resolve_model_path
from dataplane.runner.decode_graphs import DecodeGraphs

# Followers wait for the next step as long as the engine idles; the parent watchdog ends them.
FOLLOWER_TIMEOUT_S = 365 * 24 * 3600.0


def _watch_parent(parent_pid: int) -> None:
    """Exit when rank 0's process is gone (killed, crashed): otherwise we would wait on it forever."""
    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)
    threading.Thread(target=watch, name="tessera-tp-watchdog", daemon=True).start()


def main() -> None:
    """`python -m dataplane.distributed.follower READY_FD` with a pickled FollowerSpec on stdin.

    A fresh interpreter rather than multiprocessing's spawn, which re-imports the parent's main
    module: a script without a main guard would start its engine again in every rank."""
    spec: FollowerSpec = pickle.load(sys.stdin.buffer)
    follower_main(spec, os.fdopen(int(sys.argv[1]), "wb"))


def _report(ready: Any, error: str | None) -> None:
    """Rank 0 reads the pipe to its end: closing it is what says the report is complete."""
    ready.write(pickle.dumps(error))
    ready.close()


def follower_main(spec: FollowerSpec, ready: Any) -> None:
    mc, info = spec.model_config, spec.info
    _watch_parent(spec.parent_pid)
    torch.set_num_threads(spec.threads)
    try:
        args, tensors = read_weights(resolve_model_path(mc.model), progress=False)
        model, _ = build_shard(args, tensors, mc, info.rank, info.device)
        del tensors
    except BaseException:  # noqa: BLE001 - rank 0 reports it and stops the others
        _report(ready, traceback.format_exc())
        return
    _report(ready, None)
    group = init_group(info, spec.port, FOLLOWER_TIMEOUT_S)
    caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    graphs: DecodeGraphs | None = None
    box: list[Any] = [None]
    while True:
        dist.broadcast_object_list(box, src=0, group=group)
        step = box[0]
        if step is None:
            break
        if caches is None:
            a = model.args
            layer = (step.num_blocks, step.block_size, a.num_kv_heads, a.head_dim, model.dtype, model.device,
                     step.kv_cache_dtype)
            caches = [(allocate_kv_cache(*layer), allocate_kv_cache(*layer)) for _ in range(a.num_layers)]
        if isinstance(step, GraphStep):
            if graphs is None:
                graphs = DecodeGraphs(model, caches, step.block_size, step.max_num_seqs, step.table_width,
                                      step.dummy_block, step.mode)
            if step.capture is not None:
                graphs.capture_size(step.capture)
            else:
                graphs.run(step.input_ids, step.positions, step.slots, step.tables,
                           np.arange(len(step.input_ids)), step.context_lens)
            continue
        if info.device != "cpu":
            step = move(step, info.device)
        model.hidden_states(step.input_ids, step.positions, step.meta, caches)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
