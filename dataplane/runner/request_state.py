"""What the runner keeps of a request between steps, beside its InputBatch row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.sampling_params import SamplingParams
from dataplane.structured.backend import Matcher


@dataclass(slots=True)
class RunnerRequestState:
    token_ids: list[int]  # prompt + outputs known to the runner
    num_prompt_tokens: int
    params: SamplingParams
    adapter: str | None
    row: int  # its row of the runner's InputBatch (block table, progress, sampling parameters)
    matcher: Matcher | None = None  # structured outputs: the grammar's state (built at first sampling)
    pool_sum: torch.Tensor | None = None  # mean-pooled embeddings: the sum of the chunks pooled so far
