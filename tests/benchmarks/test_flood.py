"""benchmarks.flood names each 429 by what refused it, from the gateway's own wording: if
responses.refusal's messages change, this fails instead of the benchmark's table silently lumping them."""

from __future__ import annotations

import pytest

from benchmarks.flood import _reason
from controlplane.gateway.responses import refusal
from tenants.limits import Decision, WindowState


@pytest.mark.parametrize("reason", ["requests", "concurrency", "tokens", "too_large", "token_budget", "spend_budget"])
def test_every_refusal_is_named_by_its_reason(reason):
    decision = Decision(False, reason, 2.0, WindowState(20, 0, 3.0), WindowState(1000, 10, 1.0))
    error = refusal(decision, "free-co", 500)
    body = {"message": error.message, "code": error.code, "type": error.type}
    expected = "insufficient_quota" if reason.endswith("_budget") else reason
    assert _reason(body) == expected
