"""The engine's threads setting reaches torch, managed (the agent: make run, the control plane's
workers) or not; and make run leaves one core to the rest of its stack."""

from __future__ import annotations

import pytest
import torch

from controlplane.localstack import worker_threads
from dataplane.worker import entry
from dataplane.worker.agent import __main__ as agent_main


class _Stop(Exception):
    pass


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_managed_worker_applies_its_threads(monkeypatch, restore_threads, tmp_path):
    """It used to be ignored there: TESSERA_WORKER_THREADS did nothing under make run."""
    torch.set_num_threads(2)

    class Agent:  # stops main() once the engine's settings are in force, before anything is started
        def __init__(self, settings, state):
            raise _Stop(torch.get_num_threads())

    monkeypatch.setattr(agent_main, "Agent", Agent)
    monkeypatch.setenv("TESSERA_CONTROL_PLANE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TESSERA_WORKER_THREADS", "1")
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path))
    with pytest.raises(_Stop) as stopped:
        agent_main.main(["--port", "0"])
    assert stopped.value.args == (1,)


def test_a_standalone_worker_applies_its_threads(monkeypatch, restore_threads):
    torch.set_num_threads(2)

    def state(config):
        raise _Stop(torch.get_num_threads())

    monkeypatch.delenv("TESSERA_CONTROL_PLANE_URL", raising=False)
    monkeypatch.setattr(entry, "WorkerState", state)
    with pytest.raises(_Stop) as stopped:
        entry.main(["--threads", "1", "--model", "m"])
    assert stopped.value.args == (1,)


@pytest.mark.parametrize("cores,threads", [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_make_run_leaves_one_core_to_the_stack(cores, threads):
    assert worker_threads(cores) == threads
