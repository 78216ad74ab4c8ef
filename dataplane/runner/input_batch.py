"""The runner's persistent view of its requests as arrays: one row per request, kept across steps.

Why: a step used to rebuild its inputs from Python lists, request by request (block tables as one
tensor per row, slots as a comprehension, sampling parameters as lists), ~45-100 µs of host time per
running request per step on the CPU, so a 256-request decode step cost 11-25 ms before any
arithmetic (issue: a decode step must cost what the device needs). Here a request's block table,
progress and sampling parameters live in preallocated arrays from its first step to its last: a
continuing request writes only the block it was handed (once every block_size tokens), and a step
gathers every decode row's token, position, slot, block table and sampling parameters with a few
numpy indexing operations.

On CUDA a step's arrays go up through a pinned copy, asynchronously (model_runner._device,
decode_graphs._up). A decode step that repeats is not rebuilt at all (runner/steady_decodes.py).
"""

from __future__ import annotations

import numpy as np

from dataplane.sampling_params import SamplingParams

NO_SEED = -1  # `seed` of an unseeded row: its noise comes from the runner's generator


# name: (dtype, value of an unused row); one entry per row of each array
_FIELDS = {
    "num_blocks": (np.int32, 0),  # entries of the row's block table in use
    "num_computed": (np.int64, 0),  # tokens whose K/V are in the cache
    "num_tokens": (np.int64, 0),  # tokens known: prompt + outputs
    "num_prompt": (np.int64, 0),
    "last_token": (np.int64, 0),  # the newest known token: a decode's input
    "pending_index": (np.int64, -1),  # the row's place among the samples of the step launched last
    # sampling parameters (sampling/sampler.py gathers them per sampled row)
    "temperature": (np.float32, 0.0),
    "top_k": (np.int64, 0),  # 0: off
    "top_p": (np.float32, 1.0),
    "min_p": (np.float32, 0.0),
    "seed": (np.int64, NO_SEED),
    "logprobs": (np.int64, -1),  # alternatives wanted; -1: no logprobs
    "max_tokens": (np.int64, 0),
    # The row's step needs its Python state: penalties, logit bias, pooling, prompt logprobs.
    "special": (np.bool_, False),
}


class InputBatch:
    """Rows of per-request state. `add` hands out a row, `remove` takes it back; the arrays double when
    more requests are live than they were made for, and the block table widens as needed."""

    def __init__(self, rows: int, max_blocks: int) -> None:
        rows, self._width = max(rows, 1), max(max_blocks, 1)
        # int64: a step's slots are computed from it with no cast (the kernels' int32 copy is made on the way up)
        self.block_table = np.zeros((rows, self._width), dtype=np.int64)
        for name, (dtype, fill) in _FIELDS.items():
            setattr(self, name, np.full(rows, fill, dtype=dtype))
        self.free = list(range(rows - 1, -1, -1))  # popped from the end: low rows first
        self._rows = rows
        # Live rows that sample at a temperature, want logprobs, or need their Python state: while a count
        # is 0 the step gathers nothing for it.
        self.num_random = self.num_logprobs = self.num_special = 0

    def _grow(self) -> None:
        old, rows = self._rows, self._rows * 2
        table = np.zeros((rows, self._width), dtype=np.int64)
        table[:old] = self.block_table
        self.block_table = table
        for name, (dtype, fill) in _FIELDS.items():
            a = np.full(rows, fill, dtype=dtype)
            a[:old] = getattr(self, name)
            setattr(self, name, a)
        self.free[:0] = range(rows - 1, old - 1, -1)
        self._rows = rows

    def _widen(self, width: int) -> None:
        table = np.zeros((self._rows, width), dtype=np.int64)
        table[:, : self._width] = self.block_table
        self.block_table, self._width = table, width

    def add(self, params: SamplingParams, token_ids: list[int], num_prompt: int, num_computed: int,
            block_ids: list[int]) -> int:
        if not self.free:
            self._grow()
        row = self.free.pop()
        self.num_blocks[row] = 0
        self.append_blocks(row, block_ids)
        self.num_computed[row] = num_computed
        self.num_tokens[row] = len(token_ids)
        self.num_prompt[row] = num_prompt
        self.last_token[row] = token_ids[-1]
        self.temperature[row] = params.temperature
        self.top_k[row] = max(params.top_k, 0)
        self.top_p[row] = params.top_p
        self.min_p[row] = params.min_p
        self.seed[row] = NO_SEED if params.seed is None else params.seed
        self.logprobs[row] = -1 if params.logprobs is None else params.logprobs
        self.max_tokens[row] = params.max_tokens
        special = bool(params.needs_penalties or params.logit_bias or params.pooling is not None
                       or params.prompt_logprobs is not None)
        self.special[row] = special
        self._count(params.temperature > 0, params.logprobs is not None, special, 1)
        return row

    def remove(self, row: int) -> None:
        self._count(self.temperature[row] > 0, self.logprobs[row] >= 0, self.special[row], -1)
        self.free.append(row)

    def _count(self, random: bool, logprobs: bool, special: bool, sign: int) -> None:
        self.num_random += sign * bool(random)
        self.num_logprobs += sign * bool(logprobs)
        self.num_special += sign * bool(special)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        n = int(self.num_blocks[row])
        end = n + len(block_ids)
        if end > self._width:
            self._widen(max(end, self._width * 2))
        self.block_table[row, n:end] = block_ids
        self.num_blocks[row] = end
