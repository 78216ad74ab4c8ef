"""Turn a step's logits into tokens: penalties, temperature, top-k / top-p / min-p, seeds, logprobs.

Sampling uses the exponential race (argmax of p / q with q ~ Exp(1)), which equals drawing from p.
A seeded request draws its noise from a generator seeded by (seed, output index), so its tokens do
not depend on its batch mates nor on whether it was preempted and recomputed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import TokenLogprobs

_MASK = -float("inf")


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


def _seeded_noise(seed: int, index: int, vocab: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed((seed * 0x9E3779B97F4A7C15 + index) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.empty(vocab).exponential_(generator=g)


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow],
                 constrain: Callable[[torch.Tensor], None] | None = None,
                 ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """`constrain` masks disallowed tokens of some rows to -inf in place (structured outputs).
        Logprobs are the model's own, taken before logit_bias, the mask and penalties (as vLLM's
        default)."""
        logits = logits.float()
        num_rows, vocab = logits.shape
        want_logprobs = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        raw_logprobs = torch.log_softmax(logits[want_logprobs], dim=-1) if want_logprobs else None
        biased = [i for i, r in enumerate(rows) if r.params.logit_bias]
        if biased:
            logits = logits.clone()  # the model's output is an inference tensor: no in-place updates
        for i in biased:
            bias = rows[i].params.logit_bias
            logits[i, list(bias)] += torch.tensor(list(bias.values()), dtype=logits.dtype)
        if constrain is not None:
            constrain(logits)

        penalised = [i for i, r in enumerate(rows) if r.params.needs_penalties]
        if penalised:
            logits = logits.clone()
            for i in penalised:
                self._apply_penalties(logits[i], rows[i], vocab)

        tokens = torch.empty(num_rows, dtype=torch.long)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        if greedy:
            tokens[greedy] = logits[greedy].argmax(dim=-1)
        random = [i for i, r in enumerate(rows) if not r.params.greedy]
        if random:
            tokens[random] = self._sample(logits[random], [rows[i] for i in random])

        token_list = tokens.tolist()
        out_logprobs: list[TokenLogprobs | None] = [None] * num_rows
        for j, i in enumerate(want_logprobs):
            lp = raw_logprobs[j]
            k = rows[i].params.logprobs
            top = []
            if k:
                values, ids = lp.topk(k)
                top = list(zip(ids.tolist(), values.tolist(), strict=True))
            out_logprobs[i] = TokenLogprobs(token_list[i], float(lp[token_list[i]]), top)
        return token_list, out_logprobs

    @staticmethod
    def _apply_penalties(row: torch.Tensor, r: SamplingRow, vocab: int) -> None:
        p = r.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.prompt_token_ids) | set(r.output_token_ids)), dtype=torch.long)
            if seen.numel():
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        outputs = r.output_token_ids
        if (p.presence_penalty or p.frequency_penalty) and outputs:
            counts = torch.bincount(torch.tensor(outputs, dtype=torch.long), minlength=vocab)[:vocab]
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        n, vocab = logits.shape
        temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32)
        logits = logits / temps[:, None]
        top_ks = [r.params.top_k if r.params.top_k > 0 else vocab for r in rows]
        top_ps = [r.params.top_p for r in rows]
        if any(k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
            logits = _top_k_top_p(logits, torch.tensor(top_ks), torch.tensor(top_ps, dtype=torch.float32))
        probs = torch.softmax(logits, dim=-1)
        min_ps = torch.tensor([r.params.min_p for r in rows], dtype=torch.float32)
        if bool((min_ps > 0).any()):
            floor = probs.max(dim=-1, keepdim=True).values * min_ps[:, None]
            probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
        noise = torch.empty_like(probs)
        unseeded = [i for i, r in enumerate(rows) if r.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty((len(unseeded), vocab)).exponential_(generator=self.generator)
        for i, r in enumerate(rows):
            if r.params.seed is not None:
                noise[i] = _seeded_noise(r.params.seed, r.output_index, vocab)
        return (probs / noise).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p nucleus (the most likely token always stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab)[None, :]
    drop = ranks >= top_k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the mass before it already reaches top_p.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, _MASK)
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
