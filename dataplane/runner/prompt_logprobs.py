"""Prompt logprobs: each prompt token's log-probability under the logits of the position before it.

Only requests that ask pay for this: their prompt rows join the step's logits rows (the model's
`logits_indices`), and the full-vocabulary log-softmax runs over those rows alone, a slice at a time
so that a long prefill chunk never holds more than SLICE x vocab floats of log-probabilities at once.
The logits themselves cover at most a step's tokens (max_num_batched_tokens: 512 by default, 96 MiB
of float32 logits at SmolLM2's vocabulary).
"""

from __future__ import annotations

import torch

from dataplane.scheduler.output import TokenLogprobs

SLICE = 512  # rows per log-softmax: 512 x 49,152 (SmolLM2's vocabulary) float32 is 96 MiB


def prompt_logprobs(logits: torch.Tensor, spans: list[tuple[str, range, list[int]]],
                    top: dict[str, int]) -> dict[str, list[TokenLogprobs]]:
    """`logits` holds the spans' rows in order; each span's `targets` are the tokens its rows predict."""
    out: dict[str, list[TokenLogprobs]] = {}
    row = 0
    for rid, rows, targets in spans:
        k = top[rid]
        entries: list[TokenLogprobs] = []
        for s in range(0, len(rows), SLICE):
            tgt = targets[s : s + SLICE]
            lp = torch.log_softmax(logits[row + s : row + s + len(tgt)].float(), dim=-1)
            picked = lp.gather(1, torch.tensor(tgt, device=lp.device)[:, None])
            ranks = ((lp > picked).sum(dim=-1) + 1).tolist()
            chosen = picked.squeeze(1).tolist()
            if k:
                values, ids = lp.topk(k, dim=-1)
                alts = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
            else:
                alts = [[] for _ in tgt]
            entries.extend(TokenLogprobs(t, c, a, r) for t, c, a, r in zip(tgt, chosen, alts, ranks, strict=True))
        out[rid] = entries
        row += len(rows)
    return out
