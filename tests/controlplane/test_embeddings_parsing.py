"""The gateway reads an embeddings body just enough to reserve and route it: input tokens only."""

from __future__ import annotations

import orjson
import pytest

from common.errors import ApplicationError
from controlplane.gateway import parsing


def parse(body: dict) -> parsing.ParsedRequest:
    return parsing.parse(orjson.dumps({"model": "m", **body}), "embeddings")


@pytest.mark.parametrize("value,inputs,estimate,bound", [
    ("abcdef", 1, 2, 7),  # 3 bytes a token estimated; 1 a byte + BOS as the bound
    (["abc", "abcdefg"], 2, 1 + 3, 4 + 8),
    ([5, 6, 7], 1, 3, 3),  # token ids are exact
    ([[5, 6], [7]], 2, 3, 3),
])
def test_input_tokens_are_reserved_and_nothing_is_generated(value, inputs, estimate, bound):
    parsed = parse({"input": value, "encoding_format": "base64"})
    assert (parsed.kind, parsed.n, parsed.max_completion, parsed.stream) == ("embeddings", inputs, 0, False)
    assert (parsed.prompt_estimate, parsed.prompt_bound) == (estimate, bound)
    assert parsed.reserve_tokens == estimate and parsed.bound_tokens == bound


@pytest.mark.parametrize("body,param,code", [
    ({}, "input", "missing_required_parameter"),
    ({"input": 3}, "input", "invalid_type"),
    ({"input": []}, "input", "invalid_type"),
    ({"input": ["a", 1]}, "input", "invalid_type"),
    ({"input": ["a"] * (parsing.MAX_EMBEDDING_INPUTS + 1)}, "input", "too_many_inputs"),
])
def test_bad_input_is_a_400_naming_it(body, param, code):
    with pytest.raises(ApplicationError) as exc:
        parse(body)
    assert (exc.value.status, exc.value.param, exc.value.code) == (400, param, code)
