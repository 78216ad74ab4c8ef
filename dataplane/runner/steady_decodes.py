"""The decode step that repeats: kept from one step to the next while the same requests decode.

Most steps of a busy engine are the step before them advanced by one token: the same requests, in
the same order, each decoding one token. Rebuilding such a step's inputs (runner/step_inputs.py), its
attention metadata and its sampling parameters from the InputBatch cost ~50 µs of host time at batch
1 on an AVX-512 EPYC, about half of what the host spends on a step beyond the model's arithmetic.
Here the last plain decode step is kept and advanced in place: positions, input ids, slots and
context lengths are refreshed from the InputBatch with a few numpy calls into the same arrays, and on
the CPU the tensors the model reads are views of those arrays, made once. Its block tables are
re-cut only when a request got a new block; its sampling parameters are kept (only a seeded row's
output index moves).

A plain decode step: every row decodes one token and samples (no prefill chunk, no draft, no pooling,
prompt logprobs, penalties or logit bias), where attention reads K/V through the block tables (one
decode group). Under overlapped scheduling every row's input is the token the step in flight samples
for it, in the same order every step, so the rows' places among those samples are written once. A
step the kept one did not follow (drafts, a change of the batch's membership: a request joins, resumes,
finishes, is preempted; a step in flight where there was none) drops it; the runner then builds the
next one from scratch and keeps it again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dataplane.models.attention import AttentionMetadata, DecodeGroup
from dataplane.runner.input_batch import InputBatch
from dataplane.runner.step_inputs import StepInputs
from dataplane.sampling.sampler import SamplingBatch


@dataclass(slots=True)
class CpuDecodeInputs:
    """A kept step's model inputs on the CPU: tensors sharing memory with the step's arrays."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_rows: torch.Tensor
    meta: AttentionMetadata
    context_lens: np.ndarray  # what meta's context lengths view: the step's own, or an int32 copy


class SteadyDecodes:
    def __init__(self, block_size: int, int32: bool) -> None:
        self.block_size = block_size
        self.int32 = int32  # the kernels take int32 block tables and context lengths (models/attention.py)
        self.step: StepInputs | None = None
        self.sampling: SamplingBatch | None = None  # the kept step's, built by the runner on first use
        self.states: list | None = None  # its requests' runner states, listed by the runner on first use
        self.pending: torch.Tensor | None = None  # in flight: its rows' batch positions on the device
        self.in_flight = False  # its rows' inputs are tokens of the step in flight (pending = every row)
        self.advanced = False  # it was advanced at least once (not only built)
        self._cpu: CpuDecodeInputs | None = None
        self._tables_stale = False
        self._slots_follow = 0  # steps whose slots are last step's + 1 (no row reaches a new block before)
        self.reused = 0  # steps served from the kept one (tests and stats)

    def forget(self) -> None:
        """The batch's membership changed: the next step is built from scratch."""
        self.step = self.sampling = self._cpu = self.states = self.pending = None
        self._slots_follow = 0
        self.advanced = False

    def blocks_changed(self) -> None:
        """A request got new blocks: the kept block tables no longer hold every block."""
        self._tables_stale = True

    def keep(self, step: StepInputs, batch: InputBatch) -> None:
        """Keep a step built from scratch if it is a plain decode step, else keep nothing."""
        n = step.num_decodes
        # Overlapped scheduling: every row's input is a token of the step in flight, or none is.
        in_flight = step.pending is not None
        plain = (n and step.num_tokens == n and (not in_flight or len(step.pending) == n) and not step.prompt_rows
                 and not step.pool_spans and len(step.logits_rows) == n and not batch.num_special)
        self.forget()
        if plain:
            self.step, self.in_flight = step, in_flight

    def advance(self, batch: InputBatch, sched: dict[str, int], in_flight: bool) -> StepInputs | None:
        """The kept step advanced to this one, or None where this one is not the same requests each
        decoding one token (the caller builds it then). `in_flight`: a step is in flight whose tokens are
        this one's inputs (overlapped scheduling)."""
        step = self.step
        if step is None:
            return None
        n = step.num_decodes
        # The scheduler lists running requests in its own order, which holds between re-sorts: the same
        # list is the same requests in the same rows. One token each: none speculates or prefills.
        if len(sched) != n or sum(sched.values()) != n or list(sched) != step.order or in_flight != self.in_flight:
            self.forget()
            return None
        rows, pos, slots = step.decode_rows, step.positions, step.slots
        # Plain indexing into the kept arrays: a ufunc's out= or np.take costs ~1-2 µs a call at these sizes.
        pos[...] = batch.num_computed[rows]
        step.input_ids[...] = batch.last_token[rows]
        np.add(pos, 1, out=step.decode_context)
        if self._slots_follow:
            # every row writes the slot after last step's, in the same block (no row has crossed into the next)
            np.add(slots, 1, out=slots)
            self._slots_follow -= 1
        else:
            block, offset = np.divmod(pos, self.block_size)
            np.multiply(batch.block_table[rows, block], self.block_size, out=slots)
            np.add(slots, offset, out=slots)
            self._slots_follow = self.block_size - 1 - int(offset.max())  # steps before a row leaves its block
        if self.sampling is not None and self.sampling.seeds is not None:
            # the sampled token's index among the outputs: position + 1 - prompt
            np.subtract(step.decode_context, batch.num_prompt[rows], out=self.sampling.output_index)
        self.reused += 1
        self.advanced = True
        return step

    def cpu_inputs(self, step: StepInputs, batch: InputBatch) -> CpuDecodeInputs:
        """The kept step's model inputs on the CPU, refreshed (the arrays were advanced in place)."""
        cpu = self._cpu
        if cpu is None:
            meta = AttentionMetadata(slot_mapping=torch.from_numpy(step.slots), block_size=self.block_size)
            lens = step.decode_context.astype(np.int32) if self.int32 else step.decode_context
            cpu = self._cpu = CpuDecodeInputs(torch.from_numpy(step.input_ids), torch.from_numpy(step.positions),
                                              torch.arange(step.num_decodes), meta, lens)
            meta.decode_groups = [DecodeGroup(0, step.num_decodes, self._tables(step, batch), None,
                                              torch.from_numpy(lens))]
        else:
            if cpu.context_lens is not step.decode_context:
                cpu.context_lens[:] = step.decode_context
            if self._tables_stale:
                cpu.meta.decode_groups[0].block_tables = self._tables(step, batch)
        self._tables_stale = False
        return cpu

    def _tables(self, step: StepInputs, batch: InputBatch) -> torch.Tensor:
        """The decodes' block tables, every block they hold (attention reads up to each context length)."""
        rows = step.decode_rows
        tables = batch.block_table[rows, : max(int(batch.num_blocks[rows].max()), 1)]
        return torch.from_numpy(tables.astype(np.int32) if self.int32 else tables)
