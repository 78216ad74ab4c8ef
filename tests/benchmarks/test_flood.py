"""benchmarks.flood names each 429 by what refused it, from the gateway's own wording: if
responses.refusal's messages change, this fails instead of the benchmark's table silently lumping them.
And it finds its stack's processes by role for the cores-in-use column."""

from __future__ import annotations

import pytest

from benchmarks.flood import _reason
from controlplane.gateway.error_bodies import refusal
from tenants.limits import Decision, WindowState


@pytest.mark.parametrize("reason", ["requests", "concurrency", "tokens", "too_large", "token_budget", "spend_budget"])
def test_every_refusal_is_named_by_its_reason(reason):
    decision = Decision(False, reason, 2.0, WindowState(20, 0, 3.0), WindowState(1000, 10, 1.0))
    error = refusal(decision, "free-co", 500)
    body = {"message": error.message, "code": error.code, "type": error.type}
    expected = "insufficient_quota" if reason.endswith("_budget") else reason
    assert _reason(body) == expected


def test_the_stacks_processes_are_found_by_role_among_the_launchers_descendants():
    """Grandchildren count (each child of make run's launcher has its own process group), a process of the
    same name outside the launcher's tree does not (a test's gateway running beside the benchmark)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from benchmarks.flood import _stack_pids, cpu_shares

    sleeper = "import time; time.sleep(30)"
    outside = subprocess.Popen([sys.executable, "-c", sleeper, "uvicorn controlplane.asgi"])
    launcher = subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{sleeper}' uvicorn controlplane.asgi & "
                                 f"setsid {sys.executable} -c '{sleeper}' -m dataplane.worker.agent & wait"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            roles = _stack_pids(launcher)
            if roles["gateway"] and roles["worker"]:
                break
            time.sleep(0.05)
        assert len(roles["gateway"]) == 1 and len(roles["worker"]) == 1
        assert outside.pid not in roles["gateway"]
        shares = cpu_shares(roles)
        assert 0 <= shares["gateway"] and 0 < shares["host_busy"] <= shares["host_total"]
    finally:
        for pid in [p for pids in _stack_pids(launcher).values() for p in pids]:
            os.kill(pid, signal.SIGKILL)
        for proc in (outside, launcher):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("priority", ["nice10", "idle"])
def test_the_flooding_client_runs_at_its_priority(priority):
    import os
    import subprocess
    import sys

    from benchmarks.flood import _flooder_priority

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=_flooder_priority(priority))
    try:
        if priority == "idle":
            assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
        else:
            assert os.sched_getscheduler(child.pid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    finally:
        child.kill()
        child.wait()


def test_premium_clients_send_side_by_side_and_every_sample_is_kept(monkeypatch):
    """--premium-clients 2 (the issue's premium tenant streamed from 2 clients): the samples are split
    between clients that run at the same time, and every sample, stage and ITL comes back."""
    import threading

    from benchmarks import flood

    both = threading.Barrier(2, timeout=5)  # each client waits for the other: they must run side by side
    calls = []

    def fake_ttfts(url, key, model, n, max_tokens, warmup=3, stages=None, itls=None):
        both.wait()
        calls.append((n, warmup, max_tokens))
        stages.extend({"limits": float(i)} for i in range(n))
        itls.extend([10.0] * n)
        return [100.0 + i for i in range(n)]

    monkeypatch.setattr(flood, "ttfts", fake_ttfts)
    stages, itls = [], []
    samples = flood.premium_ttfts("http://x", "k", 5, 48, 2, stages, itls, warmup=0)
    assert sorted(n for n, _, _ in calls) == [2, 3] and {(w, t) for _, w, t in calls} == {(0, 48)}
    assert len(samples) == len(stages) == len(itls) == 5
