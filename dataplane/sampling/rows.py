"""One row to sample, described by its request: parameters and tokens so far."""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    params: SamplingParams
    token_ids: list[int]  # prompt + outputs so far (not copied: sliced only when penalties need it)
    num_prompt_tokens: int

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def output_index(self) -> int:
        """How many tokens this request has generated: seeds the noise for the next one."""
        return len(self.token_ids) - self.num_prompt_tokens
