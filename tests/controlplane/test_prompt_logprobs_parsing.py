"""The gateway lets max_tokens 0 through only where it scores a prompt (completions with echo or
prompt_logprobs) and then reserves the prompt alone."""

from __future__ import annotations

import orjson
import pytest

from common.errors import ApplicationError
from controlplane.gateway.parsing import parse

BASE = {"model": "m", "prompt": "Once upon a time", "max_tokens": 0}


@pytest.mark.parametrize("extra", [{"echo": True, "logprobs": 1}, {"echo": True}, {"prompt_logprobs": 0}])
def test_scoring_a_prompt_reserves_the_prompt_alone(extra):
    parsed = parse(orjson.dumps({**BASE, **extra}), "completions")
    assert parsed.max_completion == 0 and parsed.reserve_tokens == parsed.prompt_estimate


@pytest.mark.parametrize("kind,body", [
    ("completions", BASE),
    ("completions", {**BASE, "echo": False}),
    ("completions", {**BASE, "echo": "yes"}),
    ("completions", {**BASE, "max_tokens": False, "echo": True}),
    ("completions", {**BASE, "max_tokens": -1, "echo": True}),
    ("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0, "prompt_logprobs": 0}),
])
def test_max_tokens_zero_is_refused_elsewhere(kind, body):
    with pytest.raises(ApplicationError) as exc:
        parse(orjson.dumps(body), kind)
    assert exc.value.param == "max_tokens"
