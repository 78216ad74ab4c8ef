"""Prompt logprobs in the scheduler, with no model: the cache skip, one entry per position across
chunks and a preemption's recompute, and max_tokens 0 finishing after the prompt."""

from __future__ import annotations

from dataplane.request import Request
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import ModelRunnerOutput, TokenLogprobs
from tests.dataplane.helpers import EOS, assert_no_leaks, make_request, make_scheduler, run_step


def _asking(rid: str, prompt_len: int = 12, max_tokens: int = 2) -> Request:
    return Request(rid, list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=max_tokens, prompt_logprobs=0),
                   (EOS,))


def _step(sched, token: int = 7):
    """As the runner does: entries for every prompt position a chunk computes (marked by position)."""
    out = sched.schedule()
    result = ModelRunnerOutput()
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        start, p = req.num_computed_tokens, req.num_prompt_tokens
        if req.sampling_params.prompt_logprobs is not None and start < p - 1:
            end = min(start + n, p - 1)
            result.prompt_logprobs[rid] = [TokenLogprobs(req.all_token_ids[q + 1], -float(q + 1), [])
                                           for q in range(start, end)]
        if start + n == req.num_tokens and req.sampling_params.max_tokens:
            result.sampled_token_ids[rid] = [token]
    return out, sched.update(out, result)


def _positions(entries):
    return [-e.logprob for e in entries]


def test_a_cached_prompt_is_computed_again_when_its_logprobs_are_asked_for():
    sched = make_scheduler(max_num_batched_tokens=64)
    sched.add_request(make_request("warm", prompt_len=12, max_tokens=1))
    run_step(sched)
    sched.add_request(make_request("plain", prompt_len=12, max_tokens=1))
    out, _ = run_step(sched)
    assert out.new_requests[0].num_computed_tokens == 8  # two 4-token blocks from the cache
    sched.add_request(_asking("asks"))
    out, core = _step(sched)
    assert out.new_requests[0].num_computed_tokens == 0 and out.num_scheduled_tokens["asks"] == 12
    assert _positions(core[0].prompt_logprobs) == list(range(1, 12))
    while sched.has_unfinished():
        _step(sched)
    assert_no_leaks(sched)


def test_chunks_add_up_to_one_entry_per_position_sent_once():
    sched = make_scheduler(max_num_batched_tokens=5)
    sched.add_request(_asking("r", prompt_len=12, max_tokens=3))
    cores = []
    while sched.has_unfinished():
        cores += _step(sched)[1]
    with_prompt = [c for c in cores if c.prompt_logprobs is not None]
    assert len(with_prompt) == 1 and with_prompt[0].new_token_ids  # with the first token, once
    assert _positions(with_prompt[0].prompt_logprobs) == list(range(1, 12))


def test_a_preemption_recompute_does_not_repeat_entries():
    sched = make_scheduler(max_num_batched_tokens=6)
    req = _asking("r", prompt_len=12, max_tokens=3)
    sched.add_request(req)
    _step(sched)
    assert len(req.prompt_logprobs) == 6
    out = sched.schedule()
    sched._preempt(req, out)  # as an out-of-blocks step would
    sched.update(out, ModelRunnerOutput())
    assert req.num_computed_tokens == 0
    cores = []
    while sched.has_unfinished():
        cores += _step(sched)[1]
    assert _positions(req.prompt_logprobs) == list(range(1, 12))
    assert_no_leaks(sched)


def test_max_tokens_zero_finishes_after_the_prompt_without_a_token():
    sched = make_scheduler(max_num_batched_tokens=5)
    req = _asking("r", prompt_len=12, max_tokens=0)
    sched.add_request(req)
    cores = []
    while sched.has_unfinished():
        cores += _step(sched)[1]
    assert len(cores) == 1
    done = cores[0]
    assert (done.new_token_ids, done.finish_reason) == ([], "length")
    assert _positions(done.prompt_logprobs) == list(range(1, 12))
    assert req.output_token_ids == [] and sched.generation_tokens == 0
    assert_no_leaks(sched)
