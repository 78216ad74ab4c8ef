"""A step's flattened ragged batch, built from the runner's persistent rows (runner/input_batch.py).

Rows are ordered decodes first (one token each, sorted by context length), then the multi-token
chunks (prefill chunks and draft verifications). Every decode row's inputs are gathered at once with
numpy; only the chunks, and the rows that need their request's Python state (pooling, prompt
logprobs, penalties, logit bias), are handled one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dataplane.runner.pooling import PoolSpan, pool_span

if TYPE_CHECKING:
    from dataplane.runner.input_batch import InputBatch
    from dataplane.runner.request_state import RunnerRequestState


@dataclass(slots=True)
class StepInputs:
    order: list[str]  # request ids in batch order (decodes, then chunks)
    num_decodes: int  # the first rows: one token each
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slots: np.ndarray  # [T] int64 cache slot per token
    decode_rows: np.ndarray  # [num_decodes] InputBatch rows of the decodes, in batch order
    decode_context: np.ndarray  # [num_decodes] keys each decode attends to (position + 1)
    logits_rows: list[int]  # rows whose next-token logits are sampled
    sampled: list[str]  # the request of each sampled row
    sampled_rows: np.ndarray  # InputBatch row of each sampled row
    # Overlapped scheduling: batch positions (among the decodes) whose input token is still in flight on
    # the device (the host knows its position, not its id); None when there are none
    pending: np.ndarray | None = None
    chunks: list[tuple[int, int, int, list[int]]] = field(default_factory=list)  # (start, end, prefix, blocks)
    prompt_rows: list[tuple[str, range, list[int]]] = field(default_factory=list)  # prompt logprobs spans
    pool_spans: list[PoolSpan] = field(default_factory=list)  # embedding requests' rows to pool

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def build_step_inputs(batch: InputBatch, states: dict[str, RunnerRequestState], sched: dict[str, int],
                      spec: dict[str, list[int]], block_size: int, sort_decodes: bool = True) -> StepInputs:
    """`sort_decodes`: order the decodes by context length (attention that groups them by length needs
    it; attention reading through the block tables does not, and the step saves the sort)."""
    decodes = [rid for rid, n in sched.items() if n == 1]
    chunked = [rid for rid, n in sched.items() if n != 1] if len(decodes) != len(sched) else []
    rows = np.fromiter((states[rid].row for rid in decodes), dtype=np.int64, count=len(decodes))
    pos = batch.num_computed[rows]
    if sort_decodes and len(decodes) > 1:
        by_context = np.argsort(pos, kind="stable")
        if (by_context[1:] < by_context[:-1]).any():
            rows, pos = rows[by_context], pos[by_context]
            decodes = [decodes[i] for i in by_context.tolist()]
    ids = batch.last_token[rows]
    known = batch.num_tokens[rows]
    at_end = pos == known - 1
    every = bool(at_end.all())
    pending = None
    if not every:
        # Decodes of a token still in flight (overlapped scheduling): one past what the host knows.
        ahead = pos == known
        if ahead.any():
            pending = np.flatnonzero(ahead)
            at_end |= ahead
        # One-token prompt chunks short of the prompt's end: their token is not the last one.
        for i in np.flatnonzero(~at_end).tolist():
            ids[i] = states[decodes[i]].token_ids[pos[i]]
    slots = batch.block_table[rows, pos // block_size] * block_size + pos % block_size
    step = StepInputs(decodes, len(decodes), ids, pos, slots, rows, pos + 1, list(range(len(decodes))),
                      list(decodes), rows, pending)
    special = np.flatnonzero(batch.special[rows]).tolist() if batch.num_special else []
    if not every or special:
        samples = at_end
        for i in special:  # pooling and prompt logprobs of one-token chunks; prompts scored, not continued
            _extras(step, decodes[i], states[decodes[i]], i, int(pos[i]), 1)
            samples[i] &= batch.max_tokens[rows[i]] > 0
        if not samples.all():
            keep = np.flatnonzero(samples)
            step.logits_rows = keep.tolist()
            step.sampled = [decodes[i] for i in step.logits_rows]
            step.sampled_rows = rows[keep]
    if chunked:
        _add_chunks(step, batch, states, chunked, sched, spec, block_size)
    return step


def _add_chunks(step: StepInputs, batch: InputBatch, states: dict[str, RunnerRequestState], chunked: list[str],
                sched: dict[str, int], spec: dict[str, list[int]], block_size: int) -> None:
    """Prefill chunks and draft verifications, one request at a time, after the decodes."""
    ids, positions, slots = [step.input_ids], [step.positions], [step.slots]
    row0 = step.num_decodes
    sampled_rows = [step.sampled_rows]
    for rid in chunked:
        st = states[rid]
        n = sched[rid]
        start = int(batch.num_computed[st.row])
        drafts = spec.get(rid)
        tokens = st.token_ids[start : start + n] if drafts is None else [st.token_ids[start], *drafts]
        pos = np.arange(start, start + n, dtype=np.int64)
        table = batch.block_table[st.row]
        ids.append(np.asarray(tokens, dtype=np.int64))
        positions.append(pos)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        step.chunks.append((row0, row0 + n, start, table[: -(-(start + n) // block_size)].tolist()))
        if drafts is not None:  # a draft verification: every row samples (spec_decode/verify.py)
            step.logits_rows.extend(range(row0, row0 + n))
            step.sampled.extend([rid] * n)
            sampled_rows.append(np.full(n, st.row, dtype=np.int64))
        elif start + n == len(st.token_ids) and st.params.max_tokens:  # the chunk reaches the end: sample
            step.logits_rows.append(row0 + n - 1)
            step.sampled.append(rid)
            sampled_rows.append(np.array([st.row], dtype=np.int64))
        _extras(step, rid, st, row0, start, n)
        step.order.append(rid)
        row0 += n
    step.input_ids = np.concatenate(ids)
    step.positions = np.concatenate(positions)
    step.slots = np.concatenate(slots)
    step.sampled_rows = np.concatenate(sampled_rows)


def _extras(step: StepInputs, rid: str, st: RunnerRequestState, row0: int, start: int, n: int) -> None:
    """Prompt logprobs and pooling of a request computing positions [start, start + n) at batch row row0."""
    if st.params.prompt_logprobs is not None and start < st.num_prompt_tokens - 1:
        end = min(start + n, st.num_prompt_tokens - 1)  # position p predicts prompt token p + 1
        step.prompt_rows.append((rid, range(row0, row0 + end - start), st.token_ids[start + 1 : end + 1]))
    if st.params.pooling is not None and (span := pool_span(rid, st.params.pooling, row0, start, n,
                                                            st.num_prompt_tokens)):
        step.pool_spans.append(span)
