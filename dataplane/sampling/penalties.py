"""Repetition, presence and frequency penalties, for the rows of a batch that have them."""

from __future__ import annotations

import torch

from dataplane.sampling.rows import SamplingRow


def _padded(lists: list[list[int]], pad: int) -> torch.Tensor:
    width = max((len(x) for x in lists), default=0)
    out = torch.full((len(lists), width), pad, dtype=torch.long)
    for j, x in enumerate(lists):
        if x:
            out[j, : len(x)] = torch.tensor(x, dtype=torch.long)
    return out


def apply_penalties(logits: torch.Tensor, rows: list[tuple[int, SamplingRow]], vocab: int) -> None:
    """In place on the rows `rows` names: token counts by one scatter over the rows' padded token lists
    (the pad counts into a spare column). Repetition covers prompt and outputs and divides positive
    logits; frequency and presence count outputs only."""
    device = logits.device
    idx = torch.tensor([i for i, _ in rows], dtype=torch.long).to(device)
    ps = [r.params for _, r in rows]
    outputs = _padded([r.output_token_ids for _, r in rows], vocab).to(device)
    counts = torch.zeros((len(rows), vocab + 1), dtype=logits.dtype, device=device)
    counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=logits.dtype))
    counts = counts[:, :vocab]
    sub = logits[idx]
    rep = torch.tensor([p.repetition_penalty for p in ps], dtype=logits.dtype).to(device)[:, None]
    if any(p.repetition_penalty != 1.0 for p in ps):
        prompts = _padded([r.prompt_token_ids for _, r in rows], vocab).to(device)
        seen = torch.zeros((len(rows), vocab + 1), dtype=torch.bool, device=device)
        seen.scatter_(1, prompts, True)
        seen = seen[:, :vocab] | (counts > 0)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    freq = torch.tensor([p.frequency_penalty for p in ps], dtype=logits.dtype).to(device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in ps], dtype=logits.dtype).to(device)[:, None]
    logits[idx] = sub - freq * counts - presence * (counts > 0)
