"""How `make run` deploys its model (controlplane/localstack.local_quantization): a GGUF model as the
file's own blocks, anything else at bf16, and a deployment an earlier run made keeps its own."""

from __future__ import annotations

import pytest

from controlplane.localstack import local_quantization

pytestmark = pytest.mark.django_db


def test_a_gguf_model_is_served_as_its_blocks_and_an_earlier_deployment_keeps_its_own():
    from controlplane.deployments import services

    assert local_quantization("smollm2-135m-instruct") == "gguf"  # the packaged GGUF
    assert local_quantization("no-such-model") == "bf16"  # the worker will say what is wrong with it
    model = services.model_create(name="smollm2-135m-instruct")
    services.deployment_apply(model=model, replicas=1, name="smollm2-135m-instruct")  # an earlier run's, at bf16
    assert local_quantization("smollm2-135m-instruct") == "bf16"
