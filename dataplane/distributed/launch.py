"""Rank 0 of a tensor-parallel engine: spawn the other ranks, load its own shard, broadcast each step.

Rank 0 is the engine process itself: its scheduler, runner and sampler are the ordinary ones, and
its model is `TensorParallelModel`, which sends every forward pass's input to the followers before
running its own shard. A rank that dies makes the next step fail with its exit code (checked
before each step, and gloo errors on a closed peer), and the engine stays failed: the group cannot
be trusted after a collective broke half-way.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dataplane.config import ModelConfig
from dataplane.distributed.group import CommStats, RankInfo, init_group, move, rank_device, rendezvous_store
from dataplane.distributed.load import build_shard, check_supported
from dataplane.distributed.messages import FollowerSpec, GraphStep, Step
from dataplane.distributed.shard import check_tensor_parallel_size, shard_args
from dataplane.models.loader import LoadedModel, read_weights
from dataplane.models.registry import resolve_model_path
from dataplane.models.tokenizer import Tokenizer
from kernels import kv_fp8

log = logging.getLogger(__name__)

# Rank 0's bound on one collective: a step's ranks run in lockstep, so waiting this long means a
# rank is gone or stuck; the step then fails instead of hanging the engine.
RANK0_TIMEOUT_S = float(os.environ.get("TESSERA_TP_TIMEOUT", "120"))
LOAD_TIMEOUT_S = 600.0


class TensorParallelModel:
    """Rank 0's model: the LlamaModel shard, whose hidden_states first broadcasts the step."""

    def __init__(self, inner: Any, group: Any, procs: list[Any], size: int, stats: CommStats) -> None:
        self.inner = inner
        self.comm = stats  # time in collectives on this rank
        self.group = group
        self.procs = procs
        self.tensor_parallel_size = size
        self.failed: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any,
                      kv_caches: list[tuple[torch.Tensor, torch.Tensor]], lora: Any = None) -> torch.Tensor:
        if lora is not None:
            raise ValueError("adapter: LoRA is not supported with tensor_parallel_size > 1")
        key = kv_caches[0][0]
        step = Step(input_ids, positions, meta, key.shape[0], key.shape[1], "fp8" if kv_fp8.is_fp8(key) else "auto")
        self.broadcast(step if key.device.type == "cpu" else move(step, "cpu"))
        try:
            return self.inner.hidden_states(input_ids, positions, meta, kv_caches)
        except Exception as exc:
            self._check_alive()  # a dead rank is the better message
            self.failed = f"tensor parallel step failed: {exc}"
            raise RuntimeError(self.failed) from exc

    def graph_peers(self, mode: str, max_num_seqs: int, table_width: int, dummy_block: int,
                    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> _GraphPeers:
        """The followers as runner/decode_graphs.py's GraphPeers: told each decode graph step (and each
        capture) before rank 0 runs it, with what they need to build the same DecodeGraphs."""
        key = kv_caches[0][0]
        template = GraphStep(mode, max_num_seqs, table_width, dummy_block, key.shape[0], key.shape[1],
                             "fp8" if kv_fp8.is_fp8(key) else "auto")
        return _GraphPeers(self, template)

    def broadcast(self, message: Any) -> None:
        """One step message to the followers (Step, GraphStep); a failure fails the engine for good."""
        self._check_alive()
        try:
            t0 = time.perf_counter()
            dist.broadcast_object_list([message], src=0, group=self.group)
            self.comm.broadcast_seconds += time.perf_counter() - t0
            self.comm.broadcasts += 1
        except Exception as exc:
            self._check_alive()  # a dead rank is the better message
            self.failed = f"tensor parallel step failed: {exc}"
            raise RuntimeError(self.failed) from exc

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], logits_indices: torch.Tensor,
                lora: Any = None) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids, positions, meta, kv_caches, lora), logits_indices)

    def enable_compiled_decode(self, **_: Any) -> bool:
        """Refused (eager stays): every rank must run the same collectives, and the followers run eager."""
        return False

    def _check_alive(self) -> None:
        if self.failed is None:
            dead = [f for f in self.procs if f.proc.poll() is not None]
            if dead:
                self.failed = ", ".join(f"tensor parallel rank {f.rank} exited (code {f.proc.returncode})"
                                        for f in dead)
        if self.failed is not None:
            raise RuntimeError(f"{self.failed}; the engine must be restarted")

    def close(self, timeout: float = 10.0) -> None:
        """Tell the followers to exit, wait for them, and leave the group (idempotent)."""
        if not self.procs:
            return
        if self.failed is None and all(f.proc.poll() is None for f in self.procs):
            try:
                dist.broadcast_object_list([None], src=0, group=self.group)
            except Exception:  # noqa: BLE001 - they are terminated below
                log.warning("tensor parallel: could not tell the followers to stop")
        # After a failure the live ranks may sit in a collective that never completes: no waiting for them.
        deadline = time.monotonic() + (timeout if self.failed is None else 0.0)
        for f in self.procs:
            _stop(f.proc, max(0.0, deadline - time.monotonic()))
        self.procs = []
        if dist.is_initialized():
            dist.destroy_process_group()


class _GraphPeers:
    """runner/decode_graphs.GraphPeers for rank 0: each decode graph step's rows, and each capture, to the
    followers as a GraphStep (host arrays: a few hundred bytes a step)."""

    def __init__(self, model: TensorParallelModel, template: GraphStep) -> None:
        self.model, self.template = model, template
        self.local_model = model.inner  # rank 0's shard: its graphs run it, with no step broadcast inside

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, tables: np.ndarray,
            context_lens: np.ndarray) -> None:
        self.model.broadcast(replace(self.template, input_ids=input_ids, positions=positions, slots=slots,
                                     tables=tables, context_lens=context_lens))

    def capture(self, p: int) -> None:
        self.model.broadcast(replace(self.template, capture=p))


def start_tensor_parallel(mc: ModelConfig, progress: bool = True) -> LoadedModel:
    """Spawn ranks 1..N-1, load rank 0's shard here, join the group; the model broadcasts each step."""
    size = mc.tensor_parallel_size
    check_supported(mc)
    path = resolve_model_path(mc.model)
    args, tensors = read_weights(path, progress)
    check_tensor_parallel_size(args, size)  # before any process starts
    if dist.is_initialized():
        raise ValueError("tensor_parallel_size: this process already has a process group (one "
                         "tensor-parallel engine per process; close the other first)")
    on_cpu = str(mc.device).startswith("cpu")
    if not on_cpu and torch.cuda.device_count() < size:
        raise ValueError(f"tensor_parallel_size: {size} ranks need {size} GPUs, this host has "
                         f"{torch.cuda.device_count()}")
    backend = "gloo" if on_cpu else "nccl"
    # Ranks on one CPU share its cores: the engine's thread budget is split between them.
    threads = max(1, torch.get_num_threads() // size) if on_cpu else torch.get_num_threads()
    store = rendezvous_store(size, LOAD_TIMEOUT_S)
    port = store.port
    procs = [_spawn(FollowerSpec(mc, RankInfo(r, size, rank_device(mc.device, r), backend), port, threads,
                                 os.getpid())) for r in range(1, size)]
    try:
        torch.set_num_threads(threads)
        model, stats = build_shard(args, tensors, mc, 0, rank_device(mc.device, 0) if not on_cpu else "cpu")
        del tensors
        tokenizer = (Tokenizer.from_gguf(path, args.eos_token_ids) if path.is_file()
                     else Tokenizer.from_directory(path, args.eos_token_ids))
        _wait_ready(procs)
        group = init_group(RankInfo(0, size, str(model.device), backend), port, RANK0_TIMEOUT_S, store)
    except BaseException:
        for p in procs:
            _stop(p.proc, 0.0)
        raise
    log.info("tensor parallel: %d ranks (%s), %d intra-op threads each", size, backend, threads)
    return LoadedModel(TensorParallelModel(model, group, procs, size, stats), tokenizer, shard_args(args, size), path)


@dataclass(slots=True)
class _Follower:
    rank: int
    proc: subprocess.Popen
    ready_fd: int  # our end of the pipe the follower reports its load on


def _spawn(spec: FollowerSpec) -> _Follower:
    read_fd, write_fd = os.pipe()
    root = str(Path(__file__).resolve().parents[2])  # the folder holding `dataplane`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "dataplane.distributed.follower", str(write_fd)],
                            stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
    os.close(write_fd)
    proc.stdin.write(pickle.dumps(spec))
    proc.stdin.close()
    return _Follower(spec.info.rank, proc, read_fd)


def _wait_ready(followers: list[_Follower]) -> None:
    """Every follower loaded its shard; the first failure (its traceback, or its exit) is raised here."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    waiting = {f.ready_fd: f for f in followers}
    while waiting:
        if time.monotonic() > deadline:
            raise RuntimeError(f"tensor parallel ranks {sorted(f.rank for f in waiting.values())} did not load "
                               f"within {LOAD_TIMEOUT_S:.0f} s")
        readable, _, _ = select.select(list(waiting), [], [], 0.5)
        for fd in readable:
            f = waiting.pop(fd)
            with os.fdopen(fd, "rb") as pipe:
                data = pipe.read()
            if not data:
                code = f.proc.wait(5.0)
                raise RuntimeError(f"tensor parallel rank {f.rank} exited (code {code}) while loading its shard")
            error = pickle.loads(data)
            if error is not None:
                raise RuntimeError(f"tensor parallel rank {f.rank} failed to load its shard:\n{error}")


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
