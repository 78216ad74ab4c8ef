"""Prompt-lookup speculative decoding: proposals, verification, KV rollback, stops (no model)."""

from __future__ import annotations

import pytest

from dataplane.config import SchedulerConfig
from dataplane.request import RequestStatus
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import ModelRunnerOutput
from dataplane.spec_decode.config import SpeculativeConfig
from dataplane.spec_decode.ngram import propose_ngram
from dataplane.spec_decode.verify import accepted_tokens
from dataplane.structured.params import StructuredOutputs
from tests.dataplane.helpers import EOS, assert_no_leaks, make_request, make_scheduler

# A prompt that repeats itself: 10 11 12 13 14 10 11 12 13 14 10 11
LOOP = [10, 11, 12, 13, 14] * 2 + [10, 11]


def test_ngram_proposes_what_followed_the_longest_latest_match():
    assert propose_ngram(LOOP, 3, 2, 4) == [12, 13, 14]
    assert propose_ngram(LOOP, 8, 2, 4) == [12, 13, 14, 10, 11]  # stops at the end of the known tokens
    # The 3-gram (1, 2, 3) beats the 2-gram (2, 3) found later; among equal matches the latest wins.
    assert propose_ngram([1, 2, 3, 7, 9, 2, 3, 8, 5, 1, 2, 3], 2, 2, 3) == [7, 9]
    assert propose_ngram([4, 2, 3, 7, 4, 2, 3, 8, 1, 2, 3], 2, 2, 3) == [8, 1]
    assert propose_ngram([1, 2, 3, 4, 5], 3, 2, 4) == []  # nothing repeats
    assert propose_ngram([1, 2, 3, 4, 5, 3], 3, 2, 4) == []  # a single token is below prompt_lookup_min
    assert propose_ngram([1, 2, 3, 4, 5, 3], 3, 1, 4) == [4, 5, 3]
    assert propose_ngram(LOOP, 0, 2, 4) == []


def test_verification_keeps_the_matching_prefix_then_the_models_token():
    assert accepted_tokens([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted: the bonus token
    assert accepted_tokens([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert accepted_tokens([5, 6, 7], [4, 6, 7, 8]) == [4]
    with pytest.raises(ValueError, match="sampled"):
        accepted_tokens([5, 6], [5])


def spec_scheduler(k: int = 3, max_running: int = 4, **kw: object):
    return make_scheduler(speculative=SpeculativeConfig(ngram_tokens=k, max_running=max_running), **kw)


def loop_request(rid: str = "a", max_tokens: int = 20, **params: object):
    req = make_request(rid, max_tokens=max_tokens)
    req.prompt_token_ids[:] = req.all_token_ids[:] = LOOP
    req.sampling_params = SamplingParams(max_tokens=max_tokens, **params)
    return req


def prefill(sched, first_token: int = 12):
    out = sched.schedule()
    result = ModelRunnerOutput(sampled_token_ids={rid: [first_token] for rid in out.num_scheduled_tokens})
    sched.update(out, result)
    return out


def test_decode_schedules_drafts_and_rolls_back_rejected_slots():
    sched = spec_scheduler(k=3)
    req = loop_request()
    sched.add_request(req)
    first = prefill(sched)
    assert first.spec_token_ids == {}  # the prompt's chunk: nothing to verify yet
    assert req.all_token_ids[-3:] == [10, 11, 12]
    out = sched.schedule()
    assert out.spec_token_ids == {"a": [13, 14, 10]}
    assert out.num_scheduled_tokens == {"a": 4}  # the last known token + 3 drafts
    assert len(sched.kv.block_ids("a")) * 4 >= req.num_computed_tokens + 4
    computed = req.num_computed_tokens
    # The model agreed with 13, then chose 99 where the draft said 14: 2 tokens out, 2 slots rolled back.
    sched.update(out, ModelRunnerOutput(sampled_token_ids={"a": [13, 99]}))
    assert req.output_token_ids == [12, 13, 99]
    assert req.num_computed_tokens == computed + 2
    assert req.num_tokens - req.num_computed_tokens == 1  # a decode again: the next step recomputes from 99
    s = sched.stats()
    assert (s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens) == (1, 3, 1)
    # Blocks past the accepted length are not published: only full blocks of known tokens are hashed.
    full_known = req.num_tokens // 4
    assert sched.kv.num_cached_blocks["a"] <= full_known
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert_no_leaks(sched)


def test_eos_and_max_tokens_cut_an_accepted_run():
    sched = spec_scheduler(k=3)
    req = loop_request()
    sched.add_request(req)
    prefill(sched)
    out = sched.schedule()
    outputs = sched.update(out, ModelRunnerOutput(sampled_token_ids={"a": [13, EOS, 10, 11]}))
    assert outputs[0].new_token_ids == [13, EOS] and outputs[0].finish_reason == "stop"
    assert req.output_token_ids == [12, 13, EOS]
    assert_no_leaks(sched)

    sched = spec_scheduler(k=5)
    req = loop_request(max_tokens=3)
    sched.add_request(req)
    prefill(sched)
    out = sched.schedule()
    assert out.spec_token_ids == {"a": [13]}  # drafts never run past max_tokens
    outputs = sched.update(out, ModelRunnerOutput(sampled_token_ids={"a": [13, 14]}))
    assert outputs[0].finish_reason == "length" and req.output_token_ids == [12, 13, 14]
    assert_no_leaks(sched)


def test_no_drafts_in_a_busy_batch_for_grammars_or_when_asked_not_to():
    sched = spec_scheduler(k=3, max_running=2)
    reqs = [loop_request(str(i)) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    prefill(sched)
    assert sched.schedule().spec_token_ids == {}  # 3 running > max_running 2
    sched = spec_scheduler(k=3)
    grammar = loop_request("g", structured=StructuredOutputs(regex="[0-9]+", source="regex"))
    off = loop_request("off", speculative_tokens=0)
    on = loop_request("on")
    for r in (grammar, off, on):
        sched.add_request(r)
    prefill(sched)
    assert sched.schedule().spec_token_ids == {"on": [13, 14, 10]}
    # The engine default is off, and a request opts in with its own count.
    sched = make_scheduler()
    sched.add_request(loop_request("x"))
    sched.add_request(loop_request("y", speculative_tokens=2))
    prefill(sched)
    assert sched.schedule().spec_token_ids == {"y": [13, 14]}


def test_drafts_leave_blocks_for_other_decodes_and_fit_the_token_budget():
    # Two requests of 12 prompt tokens in 8 blocks of 4: after their first tokens they hold 3 blocks each
    # and each decode needs a fourth; 5 drafts would need a fifth for the first and starve the second.
    sched = spec_scheduler(k=5, num_blocks=8)
    a, b = loop_request("a", max_tokens=8), loop_request("b", max_tokens=8)
    b.prompt_token_ids[:] = b.all_token_ids[:] = [t + 10 for t in LOOP]  # no shared prefix blocks
    sched.add_request(a)
    sched.add_request(b)
    prefill(sched)
    out = sched.schedule()
    assert out.spec_token_ids == {} and out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert not out.preempted_request_ids
    sched = spec_scheduler(k=8, max_num_batched_tokens=6)
    sched.add_request(loop_request())
    out = sched.schedule()
    sched.update(out, ModelRunnerOutput())  # the first 6 prompt tokens
    prefill(sched)
    out = sched.schedule()
    assert out.spec_token_ids["a"] == [13, 14, 10, 11, 12] and out.total_num_scheduled_tokens == 6


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="speculative_ngram_tokens"):
        SpeculativeConfig(ngram_tokens=-1)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        SpeculativeConfig(prompt_lookup_min=3, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="speculative_tokens"):
        SamplingParams(speculative_tokens=99)
    assert SchedulerConfig().speculative.ngram_tokens == 0


def test_worker_body_field_and_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    from dataplane.worker.errors import WorkerError
    from dataplane.worker.metrics import EngineCollector
    from dataplane.worker.protocol import CompletionRequest

    body = {"model": "m", "prompt": "hi", "speculative": {"method": "ngram", "num_tokens": 3}}
    assert CompletionRequest(**body).sampling_params(8, None).speculative_tokens == 3
    assert CompletionRequest(model="m", prompt="hi").sampling_params(8, None).speculative_tokens is None
    for bad in ({"method": "eagle", "num_tokens": 3}, {"num_tokens": 99}, {"num_tokens": "3"}, {"k": 1}):
        with pytest.raises(WorkerError, match="speculative"):
            CompletionRequest(**{**body, "speculative": bad}).sampling_params(8, None)
    sched = spec_scheduler(k=3)
    sched.add_request(loop_request())
    prefill(sched)
    out = sched.schedule()
    sched.update(out, ModelRunnerOutput(sampled_token_ids={"a": [13, 14, 99]}))
    registry = CollectorRegistry()
    registry.register(EngineCollector("m", sched.stats))
    text = generate_latest(registry).decode()
    assert 'tessera:spec_decode_num_draft_tokens_total{model_name="m"} 3.0' in text
    assert 'tessera:spec_decode_num_accepted_tokens_total{model_name="m"} 2.0' in text
    assert 'tessera:spec_decode_num_drafts_total{model_name="m"} 1.0' in text
