"""Sampler, detokenizer and stop strings."""

from __future__ import annotations

import random

import pytest
import torch

from dataplane.engine.detokenizer import IncrementalDetokenizer
from dataplane.sampling.sampler import Sampler, SamplingRow
from dataplane.sampling_params import SamplingParams
from kernels.reference import top_k_top_p_mask


def row(**kw) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), [1, 2, 3], 3)


def test_greedy_is_argmax():
    logits = torch.randn(3, 50)
    tokens, _ = Sampler()(logits, [row(temperature=0.0)] * 3)
    assert tokens == logits.argmax(-1).tolist()


def test_seeded_rows_do_not_depend_on_batch_mates():
    torch.manual_seed(0)
    logits = torch.randn(4, 1000)
    seeded = row(temperature=1.0, seed=1234)
    alone, _ = Sampler(seed=1)(logits[2:3], [seeded])
    mixed, _ = Sampler(seed=99)(logits, [row(temperature=0.7), row(temperature=0.0), seeded, row(temperature=1.3)])
    assert mixed[2] == alone[0]
    # A different output index draws different noise: not a constant.
    draws = {Sampler()(logits[2:3], [SamplingRow(seeded.params, [0] * i, 0)])[0][0] for i in range(20)}
    assert len(draws) > 1


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1, 1e-9]]))
    sampler = Sampler(seed=3)
    counts = torch.zeros(4)
    for _ in range(2000):
        counts[sampler(logits, [row(temperature=1.0)])[0][0]] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1, 0.0]), atol=0.04)


def test_top_k_and_top_p_masks():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    masked = top_k_top_p_mask(logits, torch.tensor([2, 4]), torch.tensor([1.0, 0.8]))
    assert torch.isinf(masked[0, 2:]).all() and torch.isfinite(masked[0, :2]).all()
    # top_p=0.8: 0.5 + 0.3 reaches 0.8, so the third token is dropped.
    assert torch.isfinite(masked[1, :2]).all() and torch.isinf(masked[1, 2:]).all()
    sampler = Sampler(seed=0)
    picks = {sampler(logits[:1], [row(temperature=1.0, top_k=1)])[0][0] for _ in range(50)}
    assert picks == {0}


def test_min_p_drops_unlikely_tokens():
    logits = torch.log(torch.tensor([[0.6, 0.35, 0.05]]))
    sampler = Sampler(seed=0)
    picks = {sampler(logits, [row(temperature=1.0, min_p=0.2)])[0][0] for _ in range(300)}
    assert 2 not in picks and picks == {0, 1}


def test_penalties():
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.0]])
    # Token 0 was generated three times: frequency penalty pushes it below token 1.
    r = SamplingRow(SamplingParams(temperature=0.0, frequency_penalty=0.1), [0, 0, 0], 0)
    assert Sampler()(logits, [r])[0] == [1]
    r = SamplingRow(SamplingParams(temperature=0.0, presence_penalty=0.2), [0], 0)
    assert Sampler()(logits, [r])[0] == [1]
    # Repetition penalty covers the prompt too and divides positive logits.
    r = SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=1.2), [0], 1)
    assert Sampler()(logits, [r])[0] == [1]
    assert Sampler()(logits, [row(temperature=0.0)])[0] == [0]


def test_logprobs_are_raw_model_logprobs_with_alternatives():
    logits = torch.randn(2, 30)
    tokens, lps = Sampler()(logits, [row(temperature=0.0, logprobs=3), row(temperature=0.0)])
    want = torch.log_softmax(logits[0], -1)
    assert lps[1] is None
    assert lps[0].token_id == tokens[0] and lps[0].logprob == pytest.approx(want[tokens[0]].item(), abs=1e-5)
    assert [t for t, _ in lps[0].top] == want.topk(3).indices.tolist()


def test_logit_bias_moves_the_choice_and_leaves_logprobs_raw():
    logits = torch.tensor([[3.0, 1.0, 0.0, -2.0], [3.0, 1.0, 0.0, -2.0]])
    banned = row(temperature=0.0, logit_bias={0: -100}, logprobs=0)
    forced = row(temperature=1.0, seed=3, logit_bias={3: 100})
    tokens, lps = Sampler()(logits.clone(), [banned, forced])
    assert tokens == [1, 3]
    assert lps[0].logprob == pytest.approx(torch.log_softmax(logits[0], -1)[1].item(), abs=1e-6)
    assert Sampler()(logits[:1].clone(), [row(temperature=0.0, logit_bias={2: 3.5})])[0] == [2]  # 0 + 3.5 > 3


@pytest.mark.parametrize("bias,message", [({1: 101}, "in \\[-100, 100\\]"), ({-1: 1}, "not a token id"),
                                          ({"5": 1}, "not a token id"), ({1: True}, "must be a number")])
def test_bad_logit_bias_names_the_field(bias, message):
    with pytest.raises(ValueError, match=f"^logit_bias: .*{message}"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("field,value", [("max_tokens", 0), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5),
                                         ("n", 0), ("min_p", 2.0), ("logprobs", 21), ("stop", [""])])
def test_bad_sampling_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


# -- detokenizer ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    from dataplane.models.loader import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(resolve_model_path("smollm2-135m-instruct"), (2,))


def _stream(tokenizer, ids, params):
    d = IncrementalDetokenizer(tokenizer, params)
    pieces = []
    for t in ids:
        stop = d.add_tokens([t])
        pieces.append(d.take_new_text(finished=stop is not None))
        if stop:
            return "".join(pieces), stop
    d.finish()
    pieces.append(d.take_new_text(finished=True))
    return "".join(pieces), None


@pytest.mark.model
def test_detokenizer_fuzzed_against_whole_sequence_decoding(tokenizer):
    rng = random.Random(7)
    texts = ["héllo wörld — ünïcødé ✓ 日本語のテキスト 🙂🚀 emoji", "plain ascii text, nothing odd", "Ωμέγα καλημέρα"]
    vocab = tokenizer.vocab_size
    for trial in range(60):
        if trial % 2:
            ids = tokenizer.encode(rng.choice(texts))
        else:  # random ids include byte tokens that split multi-byte characters
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        text, _ = _stream(tokenizer, ids, SamplingParams())
        assert text == tokenizer.decode(ids), f"trial {trial}"


@pytest.mark.model
def test_streamed_pieces_are_never_broken_utf8(tokenizer):
    ids = tokenizer.encode("日本語 🙂 ünï")
    d = IncrementalDetokenizer(tokenizer, SamplingParams())
    for t in ids:
        d.add_tokens([t])
        piece = d.take_new_text(finished=False)
        assert "\ufffd" not in piece
        piece.encode("utf-8")


@pytest.mark.model
def test_stop_string_split_across_tokens(tokenizer):
    text = "The answer is forty-two. END of story, more text here"
    ids = tokenizer.encode(text)
    stop = "D of st"  # spans several tokens whatever the tokenization
    out, hit = _stream(tokenizer, ids, SamplingParams(stop=[stop]))
    assert hit == stop and out == text[: text.index(stop)]
    out, _ = _stream(tokenizer, ids, SamplingParams(stop=[stop], include_stop_str_in_output=True))
    assert out == text[: text.index(stop) + len(stop)]
