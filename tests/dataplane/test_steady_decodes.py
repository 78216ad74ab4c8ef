"""The kept decode step (runner/steady_decodes.py): while the same requests decode, a step is the last one
advanced in place instead of rebuilt. What is tested is that nothing changes: the same tokens, logprobs
and finish reasons as an engine that rebuilds every step, through block boundaries, joins, finishes,
preemption, seeds and logprobs; that its slots are exact at every step; and that it is used at all."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane import LLM, SamplingParams
from kernels import cpu_decode
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors
from tests.dataplane.same_outputs import assert_same_outputs, mixed_params

# The CPU keeps a step only where its decodes run as one group: with the C++ decode ops (a host where
# the extension cannot be built, or TESSERA_CPU_KERNELS=0, rebuilds every step, as these tests' `kept=False`)
needs_kept = pytest.mark.skipif(not cpu_decode.available(), reason="the kept step needs the C++ decode ops on the CPU")


@pytest.fixture(scope="module")
def tiny():
    args = tiny_args()
    return loaded(args, tiny_tensors(args, seed=11))


def _llm(model, kept: bool, **kw) -> LLM:
    options = {"block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 32, "kv_cache_memory": "1MiB"}
    options.update(kw)
    llm = LLM("tiny", dtype="float32", preloaded=model, **options)
    if not kept:  # the step built from the InputBatch every time, as before the kept step existed
        llm.core.runner.steady.keep = lambda step, batch: None
    return llm


def _workload():
    """Prompts of different lengths (their rows cross block boundaries at different steps), long decodes,
    greedy with logprobs, seeded top-p and top-k draws, stop tokens, n=2."""
    prompts = [[2 + (5 * i + 3 * j) % 90 for j in range(3 + 2 * i)] for i in range(8)]
    params = [mixed_params(i, (30 + i, 25 + i, 20 + 2 * i, 18 + i)[i % 4]) for i in range(8)]
    for p in params[::4]:
        p.ignore_eos = True  # the greedy ones run to their length
    return prompts, params


@needs_kept
@pytest.mark.parametrize("overlap", [False, True])
def test_the_kept_step_gives_the_rebuilt_outputs(tiny, overlap):
    """Synchronous steps, and overlapped ones (every decode's input is a token of the step in flight)."""
    prompts, params = _workload()
    want = _llm(tiny, kept=False).generate(prompts, params)
    llm = _llm(tiny, kept=True, async_scheduling=overlap)
    got = llm.generate(prompts, params)
    assert_same_outputs(want, got, text=False)
    assert llm.core.overlap == overlap
    if overlap:
        assert llm.core.runner.steps_reading_in_flight > 20
    assert llm.core.runner.steady.reused > 20  # the long decodes' steps between changes of the batch
    assert llm.core.scheduler.kv.pool.num_free == llm.core.scheduler.kv.num_blocks


@needs_kept
def test_requests_joining_and_leaving_one_by_one(tiny):
    """Each request arrives while the others decode, and each leaves at its own length: the kept step is
    dropped at every change of the batch and kept again after."""
    outs = {}
    for kept in (False, True):
        llm = _llm(tiny, kept)
        core = llm.core
        got: dict[str, list[int]] = {}
        for i in range(6):
            rid, text, children = core.make_requests([3 + i, 4 + 2 * i, 5], SamplingParams(
                max_tokens=9 + 5 * i, temperature=0.0, ignore_eos=True, logprobs=1), request_id=f"r{i}")
            core.add(rid, text, children)
            for _ in range(4):
                for o in core.step(delta=True):
                    got.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
        while core.has_unfinished():
            for o in core.step(delta=True):
                got.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
        outs[kept] = got
        if kept:
            assert core.runner.steady.reused > 20
    assert outs[True] == outs[False]
    assert [len(outs[True][f"r{i}"]) for i in range(6)] == [9 + 5 * i for i in range(6)]


@needs_kept
@pytest.mark.parametrize("overlap", [False, True])
def test_under_preemption(tiny, overlap):
    """A cache too small for the batch: requests are preempted and resumed, rows reassigned."""
    prompts, params = _workload()
    small = {"kv_cache_memory": 24 * 4 * 2 * 2 * 2 * 16 * 4}  # 24 blocks of 4 tokens (2 layers, 2 kv heads, d 16)
    want = _llm(tiny, False, async_scheduling=overlap, **small).generate(prompts, params)
    llm = _llm(tiny, True, async_scheduling=overlap, **small)
    got = llm.generate(prompts, params)
    assert llm.core.scheduler.num_preemptions > 0
    assert_same_outputs(want, got, text=False)
    assert llm.core.runner.steady.reused > 0
    assert llm.core.scheduler.kv.pool.num_free == llm.core.scheduler.kv.num_blocks


@needs_kept
def test_slots_are_exact_at_every_kept_step(tiny):
    """The kept slots move by one a step and are recomputed when a row reaches a new block: at every kept
    step they are what the block table says, for rows whose block boundaries fall at different steps."""
    llm = _llm(tiny, True, block_size=8)
    runner = llm.core.runner
    steady, inner = runner.steady, runner.steady.advance
    checked = {"follow": 0, "exact": 0}

    def advance(batch, sched, in_flight):
        follow = steady._slots_follow > 0
        step = inner(batch, sched, in_flight)
        if step is not None:
            rows, pos, bs = step.decode_rows, step.positions, steady.block_size
            assert (pos == batch.num_computed[rows]).all()
            assert (step.decode_context == pos + 1).all()
            assert (step.input_ids == batch.last_token[rows]).all()
            np.testing.assert_array_equal(step.slots, batch.block_table[rows, pos // bs] * bs + pos % bs)
            checked["follow" if follow else "exact"] += 1
        return step

    steady.advance = advance
    prompts = [[2 + j for j in range(n)] for n in (3, 4, 13)]  # first decode positions 3, 4, 13 in blocks of 8
    llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    assert checked["follow"] > 5 and checked["exact"] > 5


def test_nothing_is_kept_for_steps_that_are_not_plain_decodes(tiny):
    """Penalties and logit bias need their request's Python state each step: such a batch is rebuilt."""
    llm = _llm(tiny, True)
    llm.generate([[3, 4, 5], [6, 7]], [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
                                       SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True,
                                                      logit_bias={5: 2.0})])
    assert llm.core.runner.steady.reused == 0


def test_an_id_reused_at_once_is_a_new_request(tiny):
    """A request aborted and a new one under the same id, with a one-token prompt, in the next step: the
    step lists the same id scheduled for one token, but the row holds another request now."""
    outs = {}
    for kept in (False, True):
        core = _llm(tiny, kept).core
        got = []
        rid, text, children = core.make_requests([5, 6, 7, 8, 9], SamplingParams(
            max_tokens=30, temperature=0.0, ignore_eos=True), request_id="same")
        core.add(rid, text, children)
        for _ in range(6):
            core.step(delta=True)
        core.abort("same")
        rid, text, children = core.make_requests([40], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                                                 request_id="same")
        core.add(rid, text, children)
        for _ in range(20):  # bounded: a stale row may never reach its length
            for o in core.step(delta=True):
                got.extend(o.outputs[0].token_ids)
        assert not core.has_unfinished()
        outs[kept] = got
    assert outs[True] == outs[False] and len(outs[True]) == 6


@needs_kept
def test_steps_with_drafts_between_kept_ones(tiny):
    """Speculative steps (drafts verified, positions moved by the accepted tokens) between plain decode
    steps of the same requests: the kept step must not follow across them."""
    prompts = [[5, 6] * 6 + [5], [7, 8, 9] * 4 + [7], [3, 4, 11, 12]]
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, speculative_tokens=3, logprobs=1),
              SamplingParams(max_tokens=24, temperature=0.9, seed=3, ignore_eos=True, speculative_tokens=2),
              SamplingParams(max_tokens=28, temperature=0.0, ignore_eos=True)]
    kw = {"speculative_ngram_tokens": 3, "speculative_max_running": 4}
    want = _llm(tiny, False, **kw).generate(prompts, params)
    llm = _llm(tiny, True, **kw)
    got = llm.generate(prompts, params)
    assert_same_outputs(want, got, text=False)
    assert llm.core.stats().spec_num_drafts > 0 and llm.core.runner.steady.reused > 0


@needs_kept
def test_the_gpu_default_path_padded_graph_steps_overlapped(tiny):
    """A GPU worker's default: decode steps from the graph buffers (here `padded`: the same padded step,
    eagerly) with overlapped scheduling. Kept steps there give the rebuilt outputs too."""
    prompts, params = _workload()
    want = _llm(tiny, False).generate(prompts, params)
    llm = _llm(tiny, True, cuda_graphs="padded", async_scheduling=True)
    got = llm.generate(prompts, params)
    assert_same_outputs(want, got, text=False)
    runner = llm.core.runner
    assert runner.graphs.stats.replays > 20 and runner.steady.reused > 20 and runner.steps_reading_in_flight > 20
