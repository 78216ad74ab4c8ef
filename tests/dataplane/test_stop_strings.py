"""Stop strings: the per-request caps, and the Aho–Corasick matcher giving the naive scan's answers
(which stop wins, where the text is cut, what is held back) on random text, tokens and stop lists."""

from __future__ import annotations

import random

import pytest

from dataplane.engine.detokenizer import IncrementalDetokenizer
from dataplane.engine.stop_strings import StopMatcher, find_stop_naive
from dataplane.sampling_params import MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_STOP_TOKEN_IDS, SamplingParams

# -- caps -------------------------------------------------------------------------------------------


def test_stop_caps_are_value_errors_naming_stop():
    SamplingParams(stop=["a", "b", "c", "d"])  # OpenAI's limit: accepted
    with pytest.raises(ValueError, match=f"^stop: at most {MAX_STOP_SEQUENCES} stop sequences .* got 5"):
        SamplingParams(stop=["a", "b", "c", "d", "e"])
    SamplingParams(stop=["x" * MAX_STOP_CHARS])
    with pytest.raises(ValueError, match=f"^stop: a stop sequence is {MAX_STOP_CHARS + 1} characters"):
        SamplingParams(stop=["ok", "x" * (MAX_STOP_CHARS + 1)])
    with pytest.raises(ValueError, match="^stop: "):
        SamplingParams(stop="x" * (MAX_STOP_CHARS + 1))  # a single string counts too


def test_stop_token_ids_are_capped_and_checked():
    SamplingParams(stop_token_ids=list(range(MAX_STOP_TOKEN_IDS)))
    with pytest.raises(ValueError, match=f"^stop_token_ids: at most {MAX_STOP_TOKEN_IDS}"):
        SamplingParams(stop_token_ids=list(range(MAX_STOP_TOKEN_IDS + 1)))
    for bad in ([-1], ["7"], [True], [1.5]):
        with pytest.raises(ValueError, match="^stop_token_ids: every entry must be a token id"):
            SamplingParams(stop_token_ids=bad)


# -- the matcher against the naive scan -------------------------------------------------------------


def _random_stops(rng: random.Random, alphabet: str) -> list[str]:
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))]
    if rng.random() < 0.5:  # prefixes of each other and duplicates: where the tie-break shows
        base = rng.choice(stops)
        stops.insert(rng.randrange(len(stops) + 1), base[: rng.randint(1, len(base))])
    if rng.random() < 0.2:
        stops.append(rng.choice(stops))
    return stops


def test_matcher_finds_what_the_naive_scan_finds_on_random_text():
    rng = random.Random(0)
    for trial in range(3000):
        alphabet = "ab" if trial % 2 else "abc"
        stops = _random_stops(rng, alphabet)
        holdback = max(map(len, stops)) - 1
        text, matcher = "", StopMatcher(stops)
        while len(text) < 60:
            piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
            want = find_stop_naive(text + piece, stops, max(0, len(text) - holdback))
            got = matcher.feed(piece)
            text += piece
            assert got == want, (trial, stops, text)
            if got is not None:
                break


# A tokenizer whose tokens are characters (id = code point): the detokenizer's stop logic on its own.
class _CharStream:
    def step(self, backend: object, token_id: int) -> str:
        return chr(token_id)


class _CharTokenizer:
    backend = None

    def decode_stream(self, skip_special_tokens: bool) -> _CharStream:
        return _CharStream()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


def _naive_detokenize(chunks: list[str], params: SamplingParams) -> tuple[list[str], str | None]:
    """The detokenizer as it was before the matcher: find() per stop string over the held-back tail."""
    holdback = max((len(s) for s in params.stop), default=1) - 1
    text, emitted, pieces = "", 0, []
    for chunk in chunks:
        search_from = max(0, len(text) - holdback)
        text += chunk
        found = find_stop_naive(text, params.stop, search_from)
        if found is not None:
            i, s = found
            text = text[: i + len(s)] if params.include_stop_str_in_output else text[:i]
            pieces.append(text[emitted:])
            return pieces, s
        end = max(emitted, len(text) - holdback)
        pieces.append(text[emitted:end])
        emitted = end
    pieces.append(text[emitted:])
    return pieces, None


@pytest.mark.parametrize("include", [False, True])
def test_detokenizer_streams_and_cuts_as_the_naive_scan_did(include):
    rng = random.Random(1)
    for trial in range(500):
        stops = _random_stops(rng, "abc")[:MAX_STOP_SEQUENCES]
        params = SamplingParams(stop=stops, include_stop_str_in_output=include)
        chunks = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 3))) for _ in range(15)]
        d = IncrementalDetokenizer(_CharTokenizer(), params)
        pieces, hit = [], None
        for chunk in chunks:
            hit = d.add_tokens([ord(c) for c in chunk])
            pieces.append(d.take_new_text(finished=hit is not None))
            if hit is not None:
                break
        if hit is None:
            d.finish()
            pieces.append(d.take_new_text(finished=True))
        assert (pieces, hit) == _naive_detokenize(chunks, params), (trial, stops, chunks)


def test_many_stop_strings_share_one_automaton_per_list():
    a, b = StopMatcher(["x", "yz"]), StopMatcher(["x", "yz"])
    assert a._a is b._a  # built once, shared by requests (and n > 1 siblings) with the same list
    assert a.feed("aay") is None and a.feed("zq") == (2, "yz")
