"""A deployment picks its tool-call parser through engine_args; the worker agent applies it on load."""

from __future__ import annotations

import pytest

from common.errors import ApplicationError
from controlplane.deployments import services
from tests.controlplane.deployments.test_worker_agent import agent, spec  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("bad", ["mistral", "", 3, None, ["hermes"]])
def test_an_unknown_parser_is_refused_naming_engine_args(bad):
    model = services.model_create(name="smollm2-135m-instruct")
    with pytest.raises(ApplicationError) as exc:
        services.deployment_create(model=model, engine_args={"tool_call_parser": bad})
    assert exc.value.param == "engine_args" and "tool_call_parser" in str(exc.value)


def test_a_known_parser_is_kept():
    model = services.model_create(name="smollm2-135m-instruct")
    d = services.deployment_create(model=model, engine_args={"tool_call_parser": "pythonic"})
    assert d.engine_args == {"tool_call_parser": "pythonic"}


def test_the_agent_serves_with_the_deployments_parser_then_the_workers_again(agent):  # noqa: F811
    assert agent.state.config.tool_call_parser == "auto"  # the worker flag's default
    agent.control.specs[1] = {**spec(), "engine_args": {"tool_call_parser": "pythonic"}}
    assert agent.runner.load_model(1, 1) == "loaded"
    assert agent.state.config.tool_call_parser == "pythonic"
    agent.slot.unload()
    agent.control.specs[2] = spec(replica_id=2)
    assert agent.runner.load_model(2, 1) == "loaded"
    assert agent.state.config.tool_call_parser == "auto"  # engine_args without one: back to the flag
