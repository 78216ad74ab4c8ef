"""Turn a step's logits into tokens: penalties, temperature, top-k / top-p / min-p, seeds, logprobs.

The whole batch is sampled with a few tensor ops on the logits' device, whatever mix of parameters
its rows carry (`SamplingBatch`: one array per parameter, a value per row, decided on the host with
numpy so no decision waits for the device, once per batch: sampling/plan.py); the only per-row Python
left is for rows that ask for something only they need (penalties, logit bias, logprobs' results).
The draw itself is one of two functions of plain tensors, each a torch reference (kernels/reference.py)
with a C++ twin on the CPU (kernels/cpu_sample.py), the whole-vocabulary one also a Triton twin where the
kernels run (kernels/sample_full.py, which takes every batch there, top-k included): among each row's top-k candidates
when every drawing row has a small top_k (one `topk` instead of a sort of the vocabulary, top-p and
min-p applied to those candidates exactly as over the whole vocabulary), else over the whole
vocabulary. The tokens come back to the host in one copy.

Sampling uses the exponential race (argmax of p / q with q ~ Exp(1)), which equals drawing from p.
A seeded request's noise is a hash of (seed, output index, token id) (kernels/seeded_noise.py), so its
tokens depend neither on its batch mates nor on whether it was preempted and recomputed, nor on which
of the two draws its batch took, nor on the device. On the CPU and in the Triton kernel the
whole-vocabulary draw hashes every row's noise (unseeded rows from a seed drawn per step), so no Exp(1)
is drawn for each token.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from dataplane.sampling.penalties import apply_penalties
from dataplane.sampling.plan import DrawPlan, up
from dataplane.sampling.rows import SamplingRow
from dataplane.scheduler.output import TokenLogprobs
from kernels import cpu_sample, dispatch
from kernels.reference import sample_full_ref, sample_top_k_ref
from kernels.seeded_noise import seeded_noise


@dataclass(slots=True)
class SamplingBatch:
    """A step's sampling parameters, one entry per logits row, as host (numpy) arrays."""

    temperature: np.ndarray  # [R] float32; 0 is greedy
    top_k: np.ndarray | None = None  # [R] int64, 0: off; None when no row uses it
    top_p: np.ndarray | None = None  # [R] float32, 1: off; None when no row uses it
    min_p: np.ndarray | None = None  # [R] float32, 0: off; None when no row uses it
    seeds: np.ndarray | None = None  # [R] int64, -1: unseeded; None when no row is seeded
    output_index: np.ndarray | None = None  # [R] int64 tokens generated so far (with seeds)
    logprobs: list[tuple[int, int]] | None = None  # (row, alternatives) for rows that want logprobs
    # (rows, token ids, values): logit_bias entries of every biased row, flattened
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    penalties: list[tuple[int, SamplingRow]] | None = None  # rows with penalties and their tokens
    all_greedy: bool = False  # every row greedy and nothing else asked: argmax alone
    plan: DrawPlan | None = None  # the draw's host decisions, made at its first draw (sampling/plan.py)

    @staticmethod
    def from_rows(rows: list[SamplingRow]) -> SamplingBatch:
        """The batch for rows described one by one (tests, speculative verification steps)."""
        ps = [r.params for r in rows]
        batch = SamplingBatch(np.array([p.temperature for p in ps], dtype=np.float32))
        if any(p.top_k > 0 for p in ps):
            batch.top_k = np.array([max(p.top_k, 0) for p in ps], dtype=np.int64)
        if any(p.top_p < 1.0 for p in ps):
            batch.top_p = np.array([p.top_p for p in ps], dtype=np.float32)
        if any(p.min_p > 0 for p in ps):
            batch.min_p = np.array([p.min_p for p in ps], dtype=np.float32)
        if any(p.seed is not None for p in ps):
            batch.seeds = np.array([-1 if p.seed is None else p.seed for p in ps], dtype=np.int64)
            batch.output_index = np.array([r.output_index for r in rows], dtype=np.int64)
        batch.logprobs = [(i, p.logprobs) for i, p in enumerate(ps) if p.logprobs is not None] or None
        batch.bias = bias_entries([(i, p.logit_bias) for i, p in enumerate(ps) if p.logit_bias])
        batch.penalties = [(i, r) for i, r in enumerate(rows) if r.params.needs_penalties] or None
        batch.all_greedy = all(p.greedy for p in ps) and not batch.bias and not batch.penalties
        return batch


def _hashed_full_draw(device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The whole-vocabulary draw that hashes every row's noise itself, where one runs on `device`: the C++
    one on the CPU, the Triton kernel where kernels.dispatch runs the kernels (CUDA); else None."""
    if device.type == "cpu" and cpu_sample.available():
        return cpu_sample.sample_full
    if dispatch.use_triton(device):
        return importlib.import_module("kernels.sample_full").sample_full  # imports triton: only here
    return None


def bias_entries(biased: list[tuple[int, dict[int, float]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """logit_bias of the rows that have one, as index and value tensors."""
    if not biased:
        return None
    rows = [i for i, bias in biased for _ in bias]
    tokens = [t for _, bias in biased for t in bias]
    values = [v for _, bias in biased for v in bias.values()]
    return (torch.tensor(rows, dtype=torch.long), torch.tensor(tokens, dtype=torch.long),
            torch.tensor(values, dtype=torch.float32))


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow],
                 constrain: Callable[[torch.Tensor], None] | None = None,
                 ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """`constrain` masks disallowed tokens of some rows to -inf in place (structured outputs).
        Logprobs are the model's own, taken before logit_bias, the mask and penalties (as vLLM's
        default)."""
        return self.sample(logits, SamplingBatch.from_rows(rows), constrain)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch,
               constrain: Callable[[torch.Tensor], None] | None = None,
               ) -> tuple[list[int], list[TokenLogprobs | None]]:
        tokens, raw = self.sample_tensor(logits, batch, constrain)
        token_list = tokens.tolist()  # the step's one device -> host copy of its tokens
        return token_list, self.logprobs(raw, batch, token_list)

    def sample_tensor(self, logits: torch.Tensor, batch: SamplingBatch,
                      constrain: Callable[[torch.Tensor], None] | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sampled token of every row as a tensor on the logits' device (nothing copied to the host),
        and the raw log-softmax of the rows that want logprobs (in batch.logprobs' order)."""
        logits = logits.float()
        device = logits.device
        raw = None
        if batch.logprobs:
            raw = torch.log_softmax(logits[up(np.array([i for i, _ in batch.logprobs]), device)], dim=-1)
        if batch.all_greedy and constrain is None:
            return logits.argmax(dim=-1), raw
        if batch.bias is not None or constrain is not None or batch.penalties:
            logits = logits.clone()  # the model's output is an inference tensor: no in-place updates
        if batch.bias is not None:
            rows, ids, values = (t.to(device, non_blocking=True) for t in batch.bias)
            logits.index_put_((rows, ids), values, accumulate=True)
        if constrain is not None:
            constrain(logits)
        if batch.penalties:
            apply_penalties(logits, batch.penalties, logits.shape[1])
        if batch.all_greedy:
            return logits.argmax(dim=-1), raw
        plan = batch.plan
        if plan is None:  # decided on the host, once per batch: no sync with the device
            plan = batch.plan = DrawPlan.of(batch, logits.shape[1])
        if not len(plan.random):
            return logits.argmax(dim=-1), raw
        on = None if plan.every else plan.on("on", device, plan.random)
        temperature = plan.on("temperature", device, batch.temperature[plan.random])
        drawing = logits if plan.every else logits[on]
        hashed = _hashed_full_draw(device)
        # The candidates' draw where it is the faster one: beside the C++ whole-vocabulary draw (its own C++
        # twin) and where no hashing draw runs; the Triton kernel takes top-k as it takes top-p, in one
        # launch against ~25
        if plan.candidates and (hashed is None or hashed is cpu_sample.sample_full):
            drawn = self._draw_candidates(drawing, temperature, plan, batch.output_index)
        else:
            drawn = self._draw(drawing, temperature, plan, batch.output_index, hashed)
        if plan.every:
            return drawn, raw
        tokens = logits.argmax(dim=-1)
        tokens[on] = drawn
        return tokens, raw

    def _draw(self, logits: torch.Tensor, temperature: torch.Tensor, plan: DrawPlan, index: np.ndarray | None,
              hashed: Callable[..., torch.Tensor] | None) -> torch.Tensor:
        """One draw per row over the whole vocabulary, under top-k / top-p / min-p. On the CPU one C++ call,
        where the Triton kernels run one launch (kernels/sample_full.py), each hashing every row's noise (a
        seeded row's from its seed and output index, the others' from a seed drawn here): one number a row
        instead of an Exp(1) for each of the vocabulary's tokens. Elsewhere reference.sample_full_ref over
        Exp(1) noise, the seeded rows' hashed: one op for the unseeded rows where hashing them would be
        ~15."""
        device, rows, vocab = logits.device, logits.shape[0], logits.shape[1]
        top_k = None if plan.top_k is None else plan.on("top_k", device, plan.top_k)
        top_p = None if plan.top_p is None else plan.on("top_p", device, plan.top_p)
        min_p = None if plan.min_p is None else plan.on("min_p", device, plan.min_p)
        seeded = plan.on("seeded", device, plan.seeded) if len(plan.seeded) else None
        at = None if seeded is None else up((index if plan.every else index[plan.random])[plan.seeded], device)
        if hashed is not None:
            seeds = torch.randint(0, 1 << 62, (rows,), device=device, generator=self.generator)
            row_index = torch.zeros(rows, dtype=torch.long, device=device)
            if seeded is not None:
                seeds[seeded] = plan.on("seeds", device, plan.seeds[plan.seeded])
                row_index[seeded] = at
            return hashed(logits, temperature, top_k, top_p, min_p, seeds, row_index)
        noise = torch.empty_like(logits).exponential_(generator=self.generator)
        if seeded is not None:
            noise[seeded] = seeded_noise(plan.on("seeds", device, plan.seeds[plan.seeded]), at, vocab)
        return sample_full_ref(logits, temperature, top_k, top_p, min_p, noise)

    def _draw_candidates(self, logits: torch.Tensor, temperature: torch.Tensor, plan: DrawPlan,
                         index: np.ndarray | None) -> torch.Tensor:
        """One draw per row when every drawing row has a small top_k: among its top-k candidates, top-p's
        mass measured over the whole vocabulary and min-p against the best candidate, as the
        full-vocabulary path does (reference.sample_top_k_ref; on the CPU its C++ twin, one call)."""
        device = logits.device
        # drawn for every row (a seeded row's is unused): the generator moves the same whatever the seeds
        noise = torch.empty((logits.shape[0], plan.k), device=device).exponential_(generator=self.generator)
        seeds = at = None
        if len(plan.seeded):
            seeds = plan.on("row_seeds", device, plan.seeds)  # -1: unseeded
            at = up(index if plan.every else index[plan.random], device)
        top_k = plan.on("top_k", device, plan.top_k) if plan.ragged_k else None
        top_p = None if plan.top_p is None else plan.on("top_p", device, plan.top_p)
        min_p = None if plan.min_p is None else plan.on("min_p", device, plan.min_p)
        draw = cpu_sample.sample_top_k if device.type == "cpu" and cpu_sample.available() else sample_top_k_ref
        return draw(logits, temperature, plan.k, top_k, top_p, min_p, noise, seeds, at)

    @staticmethod
    def logprobs(raw: torch.Tensor | None, batch: SamplingBatch, tokens: list[int]) -> list[TokenLogprobs | None]:
        """TokenLogprobs for the rows that asked (the model's raw log-softmax), None for the others."""
        out: list[TokenLogprobs | None] = [None] * len(tokens)
        if not batch.logprobs or raw is None:
            return out
        picked = raw.gather(1, torch.tensor([tokens[i] for i, _ in batch.logprobs], dtype=torch.long,
                                            device=raw.device)[:, None]).flatten().tolist()
        k = max(n for _, n in batch.logprobs)
        top_values, top_ids = (raw.topk(k, dim=-1) if k else (raw[:, :0], raw[:, :0].long()))
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        for j, (i, n) in enumerate(batch.logprobs):
            out[i] = TokenLogprobs(tokens[i], picked[j], list(zip(top_ids[j][:n], top_values[j][:n], strict=True)))
        return out

