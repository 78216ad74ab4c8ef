"""Decode-only steps from persistent buffers at padded batch sizes: CUDA graphs on a GPU.

Why: on a GPU a decode step of a small model is ~1.3 ms of kernels, and launching them one by one
from Python took 22 ms (H200, SmolLM2 at full depth, `../shared/GPU.md`). A CUDA graph captured once
per batch size replays every launch of the forward in one call. Like vLLM's FULL_DECODE_ONLY mode and
SGLang's graph runner, only steps of decodes alone use it; prefill and mixed steps stay eager.

A graph reads its inputs from fixed device buffers (token ids, positions, slots, block tables, context
lengths, LoRA slot per row) and writes fixed outputs, so a step copies its inputs in, replays, and
reads `logits[:n]`. A batch of n decodes runs at the smallest captured size P >= n; rows n..P-1 are
padding: token 0 at position 0, writing and reading only a reserved dummy block past the pool's
blocks (`dummy_block`), so they never touch a request's cache.

Tensor parallel engines replay per rank: rank 0 tells the other ranks each step's rows before it replays
(`GraphPeers`, distributed/launch.py) and each replays its own graph of the same size, the NCCL
all-reduces captured inside, as vLLM does; a capture is announced likewise, so the ranks' collectives
pair up. `mode="padded"` runs the same padded step eagerly (no capture): the CPU has no graphs, but this is how
the graph-safe step is tested there (`tests/dataplane/test_decode_graphs.py`), and how a GPU run can
tell a graph's fault from the padding's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from dataplane.lora.context import LoRAStepContext, build_context
from dataplane.models.attention import AttentionMetadata, DecodeGroup

if TYPE_CHECKING:
    from dataplane.lora.context import LoRAStepContext
    from dataplane.lora.runtime import LoRARuntime
    from dataplane.models.llama import LlamaModel

log = logging.getLogger(__name__)

MODES = ("auto", "cuda", "padded", "off")  # auto: cuda on a CUDA device, off elsewhere


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, then steps of 16, and max_num_seqs itself."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    s = 8
    while s < max_num_seqs:
        sizes.append(s)
        s += 8 if s < 64 else 16
    sizes.append(max_num_seqs)
    return sizes


class GraphPeers(Protocol):
    """The other ranks of a tensor parallel engine, from rank 0's side (distributed/launch.py)."""

    local_model: LlamaModel  # rank 0's shard: what its graphs run

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, tables: np.ndarray,
            context_lens: np.ndarray) -> None:
        """Tell every rank to run this decode step from its buffers (before rank 0 runs it)."""

    def capture(self, p: int) -> None:
        """Tell every rank to capture padded size p (before rank 0 captures it)."""


@dataclass(slots=True)
class GraphStats:
    graphs: int = 0  # captured graphs
    capture_seconds: float = 0.0  # wall time of the captures (start-up's, and any on first use)
    memory_bytes: int = 0  # device memory the graphs' shared pool took
    replays: int = 0  # decode steps served by a graph (or by the padded eager step)
    eager_steps: int = 0  # decode-only steps too large for any captured size


class DecodeGraphs:
    def __init__(self, model: LlamaModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 max_num_seqs: int, table_width: int, dummy_block: int, mode: str,
                 lora: LoRARuntime | None = None, peers: GraphPeers | None = None) -> None:
        if mode not in ("cuda", "padded"):
            raise ValueError(f"decode graphs: mode must be 'cuda' or 'padded', got {mode!r}")
        if mode == "cuda" and model.device.type != "cuda":
            raise ValueError("decode graphs: CUDA graphs need a CUDA device (use mode 'padded' to test the step)")
        self.model, self.kv_caches, self.block_size, self.mode = model, kv_caches, block_size, mode
        # Tensor parallel rank 0: the other ranks replay (or capture) with it, told before each step; its
        # own forward is its shard's, whose all-reduces pair with theirs (no step broadcast inside it)
        self.peers = peers
        self.local = peers.local_model if peers is not None else model
        self.sizes = capture_sizes(max_num_seqs)
        self.lora = lora
        self.stats = GraphStats()
        p, device = self.sizes[-1], model.device
        index = torch.int32 if model.use_kernels else torch.int64  # the Triton kernels take int32 tables
        self.dummy_block, self.dummy_slot = dummy_block, dummy_block * block_size
        self.input_ids = torch.zeros(p, dtype=torch.long, device=device)
        self.positions = torch.zeros(p, dtype=torch.long, device=device)
        self.slots = torch.full((p,), self.dummy_slot, dtype=torch.long, device=device)
        self.tables = torch.full((p, table_width), dummy_block, dtype=index, device=device)
        self.context_lens = torch.ones(p, dtype=index, device=device)
        self.logits_index = torch.arange(p, dtype=torch.long, device=device)
        # LoRA (the kernels' BGMV path): each row's adapter slot, -1 for the base model and for padding.
        self.token_slots = torch.full((p,), -1, dtype=torch.int32, device=device) if lora is not None else None
        self._dirty = 0  # rows [0, _dirty) may hold an earlier step's real values
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    def padded_size(self, n: int) -> int | None:
        """The captured size a batch of n decodes runs at; None when n is larger than all of them."""
        for s in self.sizes:
            if s >= n:
                return s
        return None

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, block_table: np.ndarray,
            rows: np.ndarray, context_lens: np.ndarray, adapter_slots: list[int] | None = None,
            patch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """Logits [n, vocab] of a step of n decodes, or None when n is past the largest size (eager then).

        `block_table[rows]` are the decodes' block tables; `adapter_slots`: each row's LoRA slot (-1: base),
        None when no row has an adapter; `patch`: (rows, token ids on the device) of inputs a step still in
        flight samples (overlapped scheduling), written over the buffer after the copy from the host."""
        n = len(input_ids)
        p = self.padded_size(n)
        if p is None:
            self.stats.eager_steps += 1
            return None
        with_lora = adapter_slots is not None
        if self.mode == "cuda" and (p, with_lora) not in self._graphs:
            # before this step's rows go in: a capture runs the forward on padding rows, all of them
            log.warning("no CUDA graph captured for %d decodes (lora=%s): capturing now", p, with_lora)
            self._capture(p, with_lora)
        width = -(-int(context_lens.max()) // self.block_size)
        tables = block_table[rows, :width]
        if self.peers is not None:
            if patch is not None or with_lora:
                raise ValueError("decode graphs: tensor parallel steps take neither overlap nor LoRA")
            self.peers.run(input_ids, positions, slots, tables, context_lens)
        self._fill(n, input_ids, positions, slots, tables, context_lens, adapter_slots)
        if patch is not None:
            self.input_ids[patch[0]] = patch[1]
        self.stats.replays += 1
        if self.mode == "padded":
            return self._forward(p, with_lora)[:n]
        graph, out = self._graphs[(p, with_lora)]
        graph.replay()
        return out[:n]

    def _fill(self, n: int, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, tables: np.ndarray,
              context_lens: np.ndarray, adapter_slots: list[int] | None) -> None:
        """This step's n rows into the buffers; rows an earlier, larger step used back to padding."""
        self.input_ids[:n].copy_(_up(input_ids), non_blocking=True)
        self.positions[:n].copy_(_up(positions), non_blocking=True)
        self.slots[:n].copy_(_up(slots), non_blocking=True)
        self.tables[:n, : tables.shape[1]].copy_(_up(tables.astype(_np(self.tables.dtype))), non_blocking=True)
        self.context_lens[:n].copy_(_up(context_lens.astype(_np(self.context_lens.dtype))), non_blocking=True)
        if self.token_slots is not None:
            if adapter_slots is not None:
                self.token_slots[:n].copy_(_up(np.asarray(adapter_slots, dtype=np.int32)), non_blocking=True)
            else:
                self.token_slots[:n].fill_(-1)
        if self._dirty > n:  # padding rows: token 0 at position 0 in the dummy block, attending to it alone
            self.input_ids[n : self._dirty].zero_()
            self.positions[n : self._dirty].zero_()
            self.slots[n : self._dirty].fill_(self.dummy_slot)
            self.tables[n : self._dirty, 0].fill_(self.dummy_block)
            self.context_lens[n : self._dirty].fill_(1)
            if self.token_slots is not None:
                self.token_slots[n : self._dirty].fill_(-1)
        self._dirty = n

    def _forward(self, p: int, with_lora: bool) -> torch.Tensor:
        """The padded step's forward on the buffers' first p rows (what a graph of size p captures)."""
        meta = AttentionMetadata(slot_mapping=self.slots[:p], block_size=self.block_size,
                                 decode_groups=[DecodeGroup(0, p, self.tables[:p], None, self.context_lens[:p])])
        lora = self._lora_context(p) if with_lora else None
        hidden = self.local.hidden_states(self.input_ids[:p], self.positions[:p], meta, self.kv_caches, lora=lora)
        return self.local.logits(hidden, self.logits_index[:p])

    def _lora_context(self, p: int) -> LoRAStepContext:
        """Every adapter group at the slots' full rank (zeros past an adapter's own), slots per row from
        the buffer: one graph serves any mix of resident adapters."""
        slots = self.lora.slots
        ctx = LoRAStepContext(slots, frozenset(slots.a), slots.max_rank, num_decodes=p,
                              token_slots=self.token_slots[:p],
                              scaling=torch.ones(slots.num_slots, dtype=torch.float32, device=self.model.device))
        if not self.lora.use_kernels:  # the CPU's gathered path: built from the rows' slots on the host
            rows = [(s if s >= 0 else None, 1) for s in self.token_slots[:p].tolist()]
            if any(s is not None for s, _ in rows):
                return build_context(slots, rows, p, slots.max_rank, frozenset(slots.a), False)
        return ctx

    # -- capture (CUDA) -------------------------------------------------------------------------
    def capture(self) -> GraphStats:
        """Capture every size not yet captured (and, with LoRA, every size with adapters), largest first,
        into one shared memory pool; the caller has warmed the kernels up (engine/warmup.py)."""
        if self.mode != "cuda":
            return self.stats
        for p in reversed(self.sizes):
            for with_lora in (False, True) if self.lora is not None else (False,):
                if (p, with_lora) not in self._graphs:  # a step of that size may have captured it already
                    self._capture(p, with_lora)
        torch.cuda.synchronize(self.model.device)
        log.info("captured %d CUDA graphs for decode batches %s in %.1f s, %.1f MiB", self.stats.graphs,
                 self.sizes, self.stats.capture_seconds, self.stats.memory_bytes / 2**20)
        return self.stats

    def capture_size(self, p: int) -> None:
        """Capture size p without adapters now (a tensor parallel follower, as rank 0 captures it)."""
        if self.mode == "cuda" and (p, False) not in self._graphs:
            self._capture(p, False)

    def _capture(self, p: int, with_lora: bool) -> None:
        if self.peers is not None:
            self.peers.capture(p)  # the other ranks capture p too: the collectives inside pair up
        device = self.model.device
        free_before = torch.cuda.mem_get_info(device)[0]
        started = time.perf_counter()
        self._fill_padding(p)
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # Triton's autotuning and lazy allocations happen outside the graph
                self._forward(p, with_lora)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._forward(p, with_lora)
        self._graphs[(p, with_lora)] = (graph, out)
        self.stats.graphs = len(self._graphs)
        # Each capture's own share: a size captured on first use (before the warm-up's capture) counts too.
        self.stats.memory_bytes += max(free_before - torch.cuda.mem_get_info(device)[0], 0)
        self.stats.capture_seconds += time.perf_counter() - started

    def _fill_padding(self, p: int) -> None:
        """Every row padding (capture runs the forward on them for real)."""
        self._dirty = max(self._dirty, p)
        self._fill(0, *(np.zeros(0, dtype=np.int64) for _ in range(3)), np.zeros((0, 1), dtype=np.int64),
                   np.ones(0, dtype=np.int64), None)


def _np(dtype: torch.dtype):  # noqa: ANN202
    return np.int32 if dtype == torch.int32 else np.int64


def _up(array: np.ndarray) -> torch.Tensor:
    """A host array for a copy into a device buffer: pinned on CUDA builds so the copy is asynchronous
    (the caching host allocator keeps the pinned block until the copy has run)."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t.pin_memory() if torch.cuda.is_available() else t
