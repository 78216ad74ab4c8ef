"""Torch work beside the engine thread runs on threads that exit (dataplane/engine/passing_thread.py):
libgomp throttles its barriers once threads that ran parallel regions outnumber the CPUs, which halved
batch-1 decode in a worker that loaded its model on an executor thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dataplane.engine.passing_thread import call_in_passing_thread, in_passing_thread
from dataplane.worker.config import WorkerConfig
from dataplane.worker.state import WorkerState


def test_the_call_runs_on_a_thread_that_is_gone_afterwards_and_errors_come_back():
    ran_on: list[threading.Thread] = []
    assert call_in_passing_thread(lambda x, y=0: ran_on.append(threading.current_thread()) or x + y, 2, y=3) == 5
    assert ran_on[0] is not threading.current_thread() and not ran_on[0].is_alive()
    with pytest.raises(KeyError, match="nope"):
        call_in_passing_thread(lambda: {}["nope"])
    assert asyncio.run(in_passing_thread(lambda: threading.current_thread().name, thread_name="x")) == "x"


def test_the_worker_loads_its_model_on_a_thread_that_then_exits(monkeypatch):
    loaded_on: list[threading.Thread] = []

    class Engine:
        max_model_len = 16
        core = type("Core", (), {"memory": type("Memory", (), {"num_blocks": 1})()})()

    def from_args(model, **kwargs):
        loaded_on.append(threading.current_thread())
        return Engine()

    monkeypatch.setattr("dataplane.worker.state.AsyncLLM.from_args", from_args)
    monkeypatch.setattr("dataplane.worker.state.Serving", lambda *args: None)
    state = WorkerState(WorkerConfig(model="m", warmup=False))
    asyncio.run(state.load())
    assert state.engine is not None and loaded_on[0].name == "tessera-load" and not loaded_on[0].is_alive()
