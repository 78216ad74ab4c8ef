"""Structured outputs: the spec's checks, grammar compilation and matching on SmolLM2's tokenizer, and
the engine constraining real generations (JSON schema, JSON mode, regex, choice, EBNF) without
touching unconstrained requests in the same batch."""

from __future__ import annotations

import json
import re

import pytest

from dataplane import LLM, SamplingParams
from dataplane.structured.params import StructuredOutputs
from tests.dataplane.conftest import MODEL

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                         "languages": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                       "maxItems": 3}},
          "required": ["name", "age", "languages"]}


# -- the spec -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({}, "exactly one of"),
    ({"regex": "a", "choice": ["a"]}, r"exactly one of .* \(got regex, choice\)"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": "[1, 2]"}, "must be an object"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"choice": "yes"}, "choice must be a list"),
    ({"choice": []}, "choice must be a non-empty list"),
    ({"choice": ["a", ""]}, "non-empty strings"),
    ({"grammar": "  "}, "grammar must be a non-empty string"),
])
def test_bad_specs_are_value_errors_naming_their_source(kwargs, message):
    with pytest.raises(ValueError, match=f"^response_format: .*{message}"):
        StructuredOutputs(**kwargs, source="response_format")


def test_an_oversized_constraint_is_refused_before_compiling():
    from dataplane.structured.params import MAX_SPEC_CHARS

    with pytest.raises(ValueError, match=f"^guided_regex: the regex is {MAX_SPEC_CHARS + 1} characters"):
        StructuredOutputs(regex="a" * (MAX_SPEC_CHARS + 1), source="guided_regex")
    StructuredOutputs(regex="a" * MAX_SPEC_CHARS)  # at the limit: accepted


def test_a_schema_keeps_its_property_order_and_keys_compare_by_content():
    a = StructuredOutputs(json={"type": "object", "properties": {"z": {}, "a": {}}})
    assert list(json.loads(a.json)["properties"]) == ["z", "a"]  # order is what the output follows
    b = StructuredOutputs(json=a.json, source="guided_json")
    assert a == b and a.key == b.key and a.kind == "json"
    assert StructuredOutputs(choice=["x", "y"]).key == ("choice", '["x", "y"]')


def test_ignore_eos_cannot_be_combined_with_a_grammar():
    with pytest.raises(ValueError, match="^ignore_eos: cannot be combined with response_format"):
        SamplingParams(ignore_eos=True, structured=StructuredOutputs(json_object=True, source="response_format"))


# -- compiling and matching on the real tokenizer ---------------------------------------------------

@pytest.fixture(scope="module")
def llm(smollm_fp32):
    return LLM(MODEL, dtype="float32", preloaded=smollm_fp32, max_num_seqs=16, kv_cache_memory="64MiB")


@pytest.mark.parametrize("spec,what", [
    (StructuredOutputs(json={"type": "nonsense"}, source="response_format"), "invalid JSON schema: Unsupported type"),
    (StructuredOutputs(regex="(ab", source="guided_regex"), "invalid regex: .*parenthesis"),
    (StructuredOutputs(grammar="root ::= ", source="structured_outputs"), "invalid grammar: "),
])
def test_compile_errors_name_the_source_and_drop_the_library_prefix(llm, spec, what):
    with pytest.raises(ValueError, match=f"^{spec.source}: {what}") as err:
        llm.core.structured.compile(spec)
    assert ".cc:" not in str(err.value) and "[" not in str(err.value).split(":")[0]


def test_grammars_are_compiled_once(llm):
    backend = llm.core.structured
    spec = StructuredOutputs(regex="[a-c]{4}")
    first = backend.compile(spec)
    count = backend.num_compiled
    assert backend.compile(StructuredOutputs(regex="[a-c]{4}", source="other")) is first
    assert backend.num_compiled == count


def test_matcher_follows_tokens_and_ends_on_eos(llm):
    backend, tok = llm.core.structured, llm.tokenizer
    spec = StructuredOutputs(json=PERSON)
    good = tok.hf('{"name": "Ada", "age": 36, "languages": ["en"]}', add_special_tokens=False).input_ids
    m = backend.matcher(spec, good)  # replaying outputs (a resumed request) accepts them all
    mask = backend.allocate_bitmask(1)
    m.fill(mask, 0)
    allowed = [t for t in range(tok.hf.vocab_size) if mask[0, t // 32] >> (t % 32) & 1]
    assert allowed == list(tok.eos_token_ids)  # the object is complete: only EOS may follow
    assert m.accept(tok.eos_token_ids[0]) and m.terminated
    with pytest.raises(ValueError, match="does not match the grammar"):
        backend.matcher(spec, tok.hf('{"age": 1', add_special_tokens=False).input_ids)  # name comes first


# -- the engine ---------------------------------------------------------------------------------------

def _idle(llm: LLM) -> bool:
    s = llm.core.stats()
    return s.num_running == 0 and s.num_waiting == 0 and s.num_free_blocks == s.num_blocks


def _chat(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def _check_person(text: str) -> dict:
    value = json.loads(text)
    assert list(value) == ["name", "age", "languages"]
    assert isinstance(value["name"], str) and len(value["name"]) <= 20
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool)
    assert isinstance(value["languages"], list) and len(value["languages"]) <= 3
    assert all(isinstance(x, str) and len(x) <= 12 for x in value["languages"])
    return value


def test_json_schema_output_parses_and_follows_the_schema(llm):
    prompt = _chat(llm, "Describe Ana, a 31 year old engineer who speaks Spanish and English.")
    (free,) = llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0.0))
    with pytest.raises((ValueError, AssertionError)):  # the model alone does not answer in this shape
        _check_person(free.text)
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=80, temperature=0.0,
                                                   structured=StructuredOutputs(json=PERSON)))
    assert out.finish_reason == "stop"
    _check_person(out.text)
    assert _idle(llm)


def test_sampled_completions_all_follow_the_schema(llm):
    prompt = _chat(llm, "Invent a person.")
    (out,) = llm.generate([prompt], SamplingParams(n=3, max_tokens=80, temperature=1.0, seed=7,
                                                   structured=StructuredOutputs(json=PERSON)))
    texts = [c.text for c in out.outputs]
    assert len(set(texts)) > 1, "siblings must sample, not copy"
    for c in out.outputs:
        assert c.finish_reason == "stop", c.text
        _check_person(c.text)


def test_json_mode_regex_choice_and_grammar(llm):
    prompt = _chat(llm, "Is the sky blue? Answer.")
    specs = [StructuredOutputs(json_object=True), StructuredOutputs(regex=r"(yes|no), [0-9]{2} percent"),
             StructuredOutputs(choice=["definitely", 'say "maybe"', "non, très peu"]),
             StructuredOutputs(grammar='root ::= "The answer is " ("yes" | "no") "."')]
    outs = llm.generate([prompt] * 4, [SamplingParams(max_tokens=40, temperature=0.0, structured=s) for s in specs])
    assert all(o.finish_reason == "stop" for o in outs), [o.text for o in outs]
    assert isinstance(json.loads(outs[0].text), dict)
    assert re.fullmatch(r"(yes|no), [0-9]{2} percent", outs[1].text)
    assert outs[2].text in specs[2].choice
    assert re.fullmatch(r"The answer is (yes|no)\.", outs[3].text)


def test_unconstrained_batch_mates_are_untouched(llm):
    prompts = ["The capital of France is", "Count: one, two, three,"]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = llm.generate(prompts, greedy)
    mixed = llm.generate([prompts[0], _chat(llm, "JSON please"), prompts[1]],
                         [greedy, SamplingParams(max_tokens=30, temperature=0.0,
                                                 structured=StructuredOutputs(json=PERSON)), greedy])
    assert [mixed[0].token_ids, mixed[2].token_ids] == [a.token_ids for a in alone]


def test_logprobs_are_the_models_own(llm):
    prompt = _chat(llm, "Pick one.")
    spec = StructuredOutputs(choice=["alpha", "beta"])
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, structured=spec))
    (free,) = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, logprobs=3))
    first, raw = out.outputs[0].logprobs[0], free.outputs[0].logprobs[0]
    # The mask changes what is sampled, not the reported distribution: the first position's top
    # alternatives are the unconstrained model's, finite, though the grammar forbids some of them.
    assert [t for t, _ in first.top] == [t for t, _ in raw.top]
    # (1e-3: the second request reads the prompt from the prefix cache, a different summation order)
    assert [lp for _, lp in first.top] == pytest.approx([lp for _, lp in raw.top], abs=1e-3)
    assert all(lp > -1e9 for _, lp in first.top)
    assert out.text in spec.choice and first.logprob <= max(lp for _, lp in first.top)


def test_a_bad_grammar_is_refused_before_scheduling(llm):
    spec = StructuredOutputs(json={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},
                             source="response_format")
    with pytest.raises(ValueError, match="^response_format: invalid JSON schema"):
        llm.generate(["hi"], SamplingParams(max_tokens=4, structured=spec))
    assert _idle(llm)


def test_a_structured_request_survives_preemption(smollm_fp32):
    spec = StructuredOutputs(json=PERSON)
    big = LLM(MODEL, dtype="float32", preloaded=smollm_fp32)
    prompt = big.tokenizer.apply_chat_template([{"role": "user", "content": "Describe Bob, who is 40."}])
    params = SamplingParams(max_tokens=60, temperature=0.8, seed=3, structured=spec)
    (want,) = big.generate([prompt], params)
    per_block = 16 * 2 * 30 * 3 * 64 * 4
    small = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=7 * per_block)
    rival = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)
    outs = small.generate([prompt, "A second long request that competes for the same blocks"], [params, rival],
                          priorities=[1, 0])
    assert small.core.stats().num_preemptions > 0
    assert outs[0].token_ids == want.token_ids  # the matcher was rebuilt from the replayed outputs
    _check_person(outs[0].text)


def test_a_failing_grammar_fails_its_request_alone(llm, monkeypatch):
    from dataplane.structured.backend import GrammarBackend

    real = GrammarBackend.matcher

    def broken(self, spec, outputs):
        if spec.kind == "regex":
            raise RuntimeError("matcher exploded")
        return real(self, spec, outputs)

    monkeypatch.setattr(GrammarBackend, "matcher", broken)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    outs = llm.generate(["The capital of France is", "Pick a digit:", "Say yes or no:"],
                        [greedy, SamplingParams(max_tokens=6, temperature=0.0,
                                                structured=StructuredOutputs(regex="[0-9]")),
                         SamplingParams(max_tokens=6, temperature=0.0, structured=StructuredOutputs(choice=["yes", "no"]))])
    assert outs[1].finish_reason == "error" and "matcher exploded" in outs[1].outputs[0].error
    assert outs[0].finish_reason in ("stop", "length") and outs[0].token_ids
    assert outs[2].text in ("yes", "no")
    assert _idle(llm)  # the failed request's blocks are back
