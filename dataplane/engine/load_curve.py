"""The engine's load curve: what a step costs on this worker, measured by a short sweep after warm-up.

Capacity planning (controlplane/deployments/capacity/) needs, per worker class, how long a step
takes for the work a load puts in it: a decode step of b running requests, a prefill of n prompt
tokens, and what a longer context adds. A worker measures that on its own hardware once it has
warmed up (so no first-shape kernel build is timed), in a few seconds, with throwaway requests,
and reports it with the replica's "ready". Measured rather than taken from production metrics
because production steps mix all three and the planner needs them apart; it is the whole
step's wall time (schedule, forward, update, detokenize), which is what a token's latency sees.

The wire format (a plain dict, version 1) is read by controlplane/deployments/capacity/curve.py:
  decode: [[batch, seconds per step], ...] at `context_tokens` of context per request
  long_context: {"batch": b, "tokens": t, "seconds": s} (the same step at a longer context) or null
  prefill: [[prompt tokens in one step, seconds], ...]
  max_num_seqs, max_num_batched_tokens, kv_cache_tokens: the engine's limits
  threads, device, sweep_seconds: how it was measured
"""

from __future__ import annotations

import statistics
import time
from itertools import count

import torch

from dataplane.engine.core import EngineCore
from dataplane.engine.warmup import add_throwaway, forget_throwaway

VERSION = 1
BATCH_LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_LADDER = (32, 128, 512)  # a longer prompt is chunked by the step budget into these
CONTEXT_TOKENS = 32  # each decode request's prompt: short, so the batch ladder measures the batch
LONG_CONTEXT_TOKENS = 512  # a second context length, for what attention adds per context token
LONG_CONTEXT_BATCH = 2  # small: its prefill (batch x tokens) is the sweep's longest part on a CPU
TIMED_STEPS = 5  # decode steps timed per batch size (the median is kept)


def measure_load_curve(core: EngineCore) -> dict:
    """Run the sweep on the calling thread (the engine's), between requests; then forget it."""
    if core.has_unfinished():
        raise RuntimeError("measure_load_curve: the engine has requests; measure before serving")
    started = time.perf_counter()
    config = core.scheduler.config
    seqs, budget = config.max_num_seqs, config.max_num_batched_tokens
    capacity = core.memory.kv_cache_tokens
    ids = count()
    try:
        batches = sorted({b for b in BATCH_LADDER if b <= seqs} | {seqs})
        decode = []
        for b in batches:
            if b * (CONTEXT_TOKENS + TIMED_STEPS + 4) > capacity:
                break  # the rest would preempt: a step that recomputes is not a decode step
            decode.append([b, _decode_seconds(core, ids, b, CONTEXT_TOKENS)])
        long_context = None
        long_batch = min(LONG_CONTEXT_BATCH, seqs)
        if (LONG_CONTEXT_TOKENS + TIMED_STEPS + 4 <= core.max_model_len
                and long_batch * (LONG_CONTEXT_TOKENS + TIMED_STEPS + 4) <= capacity):
            long_context = {"batch": long_batch, "tokens": LONG_CONTEXT_TOKENS,
                            "seconds": _decode_seconds(core, ids, long_batch, LONG_CONTEXT_TOKENS)}
        prefill = [[n, _prefill_seconds(core, ids, n)] for n in PREFILL_LADDER
                   if n <= budget and n + 2 <= core.max_model_len and n + 2 <= capacity]
    finally:
        for rid in list(core.processor.parents):
            if rid.startswith("load-curve-"):
                core.abort(rid)
        forget_throwaway(core)
    return {"version": VERSION, "decode": decode, "context_tokens": CONTEXT_TOKENS,
            "long_context": long_context, "prefill": prefill, "max_num_seqs": seqs,
            "max_num_batched_tokens": budget, "kv_cache_tokens": capacity, "threads": torch.get_num_threads(),
            "device": str(core.model.device), "sweep_seconds": round(time.perf_counter() - started, 3)}


def _prompt(core: EngineCore, seed: int, n: int) -> list[int]:
    # Distinct per request: no prefix-cache hit shortens a prefill or shares a block.
    vocab = core.model.args.vocab_size
    return [(211 + 97 * seed + 13 * j + (j * j) % 7) % vocab for j in range(n)]


def _decode_seconds(core: EngineCore, ids: count, batch: int, context: int) -> float:
    """Median wall time of a decode step of `batch` requests at `context` tokens of context."""
    rids = []
    for _ in range(batch):
        seed = next(ids)
        rid = f"load-curve-{seed}"
        add_throwaway(core, rid, _prompt(core, seed, context), max_tokens=TIMED_STEPS + 3)
        rids.append(rid)
    started: set[str] = set()
    while len(started) < batch:  # prefill (chunked or not): every request has its first token
        for o in core.step(delta=True):
            started.add(o.request_id)
    times = []
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        core.step(delta=True)
        times.append(time.perf_counter() - t0)
    for rid in rids:
        core.abort(rid)
    _drain(core)
    return round(statistics.median(times), 6)


def _prefill_seconds(core: EngineCore, ids: count, n: int) -> float:
    """Wall time of the step that prefills one prompt of `n` tokens (best of two)."""
    best = float("inf")
    for _ in range(2):
        seed = next(ids)
        add_throwaway(core, f"load-curve-{seed}", _prompt(core, seed, n), max_tokens=1)
        t0 = time.perf_counter()
        core.step(delta=True)
        best = min(best, time.perf_counter() - t0)
        _drain(core)
    return round(best, 6)


def _drain(core: EngineCore) -> None:
    while core.has_unfinished():
        core.step(delta=True)
