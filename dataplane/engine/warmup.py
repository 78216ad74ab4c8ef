"""Start-up warm-up: run the batch shapes a server will see before it takes its first request.

oneDNN builds a kernel per matmul shape the first time it meets it, and on the CPU a linear's
shape is (tokens in the step) x (its weight): a step of a token count never seen before pays for
a kernel build per projection (0.4-5 ms each for SmolLM2's projections, 1 thread, measured on AMD
EPYC AVX-512 BF16, 2026-11-25), so a fresh worker's first pass at 32 concurrent ran at two
thirds of its second. Here the engine runs throwaway requests shaped so that every decode batch
size from max_num_seqs down to 1 occurs once (request i stops after i + 2 tokens), then single
prefills along a ladder of chunk sizes up to the step's token budget. Arbitrary mixed steps
(prefill chunks beside decodes) still meet new token counts: the ladder covers the common ones.

Afterwards the engine forgets it: counters behind /metrics, the prefix cache and the step-time
fit are reset, so a tenant's first request is billed, cached and guarded as if nothing ran.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from dataplane.engine.core import EngineCore
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.step_cost import StepCostModel

log = logging.getLogger(__name__)

PREFILL_LADDER = (16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(slots=True)
class WarmupReport:
    seconds: float  # wall clock of the whole warm-up
    steps: int  # engine steps run
    decode_batch_sizes: int  # distinct decode batch sizes run (max_num_seqs .. 1)
    prefill_sizes: list[int]  # single-prefill chunk sizes run
    cuda_graphs: int = 0  # decode graphs captured (runner/decode_graphs.py), on a CUDA device
    graph_capture_seconds: float = 0.0


def warm_up(core: EngineCore, max_num_seqs: int | None = None) -> WarmupReport:
    """Run the warm-up on the calling thread (the engine's own, or before it starts), then reset."""
    if core.has_unfinished():
        raise RuntimeError("warm_up: the engine already has requests; warm up before serving")
    started = time.perf_counter()
    config = core.scheduler.config
    seqs = min(max_num_seqs or config.max_num_seqs, config.max_num_seqs)
    budget = config.max_num_batched_tokens
    steps = 0
    try:
        steps = _ramp_and_ladder(core, seqs, budget)
        graphs = core.runner.graphs
        if graphs is not None:  # every size captured now, its kernels warm: no request pays for a capture
            graphs.capture()
    finally:  # a failed warm-up leaves nothing running and nothing counted
        for rid in list(core.processor.parents):
            if rid.startswith("warmup-"):
                core.abort(rid)
        forget_throwaway(core)
    sizes = _ladder(core, budget)
    report = WarmupReport(time.perf_counter() - started, steps, seqs, sizes)
    if core.runner.graphs is not None:
        report.cuda_graphs = core.runner.graphs.stats.graphs
        report.graph_capture_seconds = core.runner.graphs.stats.capture_seconds
    log.info("engine warmed up: %d steps in %.1f s (decode batches %d..1, prefills %s)", report.steps,
             report.seconds, seqs, sizes)
    return report


def _ladder(core: EngineCore, budget: int) -> list[int]:
    return [n for n in PREFILL_LADDER if n <= budget and n < core.max_model_len]


def _ramp_and_ladder(core: EngineCore, seqs: int, budget: int) -> int:
    vocab = core.model.args.vocab_size
    steps = 0
    # Decode ramp: short distinct prompts (no shared cached blocks), stopping one per step.
    prompt_len = max(1, min(8, budget // max(seqs, 1), core.max_model_len - seqs - 2))
    for i in range(seqs):
        ids = [(17 + 31 * i + 7 * j) % vocab for j in range(prompt_len)]
        add_throwaway(core, f"warmup-decode-{i}", ids, max_tokens=min(i + 2, core.max_model_len - prompt_len))
    steps += _run(core)
    # Prefill ladder: one prompt at a time, one token each.
    for n in _ladder(core, budget):
        ids = [(101 + 13 * n + 3 * j) % vocab for j in range(n)]
        add_throwaway(core, f"warmup-prefill-{n}", ids, max_tokens=1)
        steps += _run(core)
    return steps


def add_throwaway(core: EngineCore, rid: str, ids: list[int], max_tokens: int) -> None:
    """A greedy request that ignores EOS (its length is known), for the engine's own measurements."""
    params = SamplingParams(max_tokens=max(1, max_tokens), ignore_eos=True, temperature=0)
    rid, text, children = core.make_requests(ids, params, request_id=rid)
    core.add(rid, text, children)


def _run(core: EngineCore) -> int:
    steps = 0
    while core.has_unfinished():
        core.step(delta=True)
        steps += 1
    return steps


def forget_throwaway(core: EngineCore) -> None:
    """What the warm-up (or the load curve's sweep) left in counters and caches, undone: metrics start at zero."""
    s = core.scheduler
    s.num_preemptions = s.prompt_tokens = s.generation_tokens = 0
    s.spec_num_drafts = s.spec_num_draft_tokens = s.spec_num_accepted_tokens = 0
    s.step_cost = StepCostModel()  # first-shape steps are slow: they would skew the step-time fit
    pool = s.kv.pool
    pool.queries = pool.hits = 0
    s.kv.reset_prefix_cache()
