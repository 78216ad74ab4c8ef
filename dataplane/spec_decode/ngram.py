"""Prompt-lookup (n-gram) proposals, as vLLM's `ngram` method: a model-free draft.

For a decoding request, find its last n tokens (n from prompt_lookup_max down to prompt_lookup_min)
earlier in its own prompt + output and propose the k tokens that followed there. Tasks that copy
from their input (summaries, edits, code changes, extraction, quoting) continue the way the input did
more often than not, and a verify step of 1 + k tokens costs little more than a decode at batch 1.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k draft tokens following the latest earlier occurrence of the longest matching suffix.

    The latest occurrence: in a request that repeats itself, the nearest repetition is the best
    guess of what comes next; in one that copies its prompt, there is usually one occurrence anyway."""
    size = len(token_ids)
    if k <= 0 or size <= min_n:
        return []
    a = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = a[size - n:]
        # Candidate starts i in [0, size - n - 1]: the suffix itself (i = size - n) is excluded and a
        # match there leaves at least one token after it to propose.
        cand = np.flatnonzero(a[: size - n] == suffix[0])
        for j in range(1, n):
            if cand.size == 0:
                break
            cand = cand[a[cand + j] == suffix[j]]
        if cand.size:
            start = int(cand[-1]) + n
            return a[start : start + k].tolist()
    return []
