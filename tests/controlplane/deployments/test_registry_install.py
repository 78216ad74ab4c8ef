"""The gateway owns the registry interface; the deployments app installs its implementation at start-up."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.deployments.routing import DeploymentRegistry
from controlplane.gateway.routing import workers


@pytest.fixture
def fresh_registry(settings):
    settings.TESSERA_WORKERS = ""
    saved = workers._registry, workers._dynamic_registry
    workers._registry = None
    yield
    workers._registry, workers._dynamic_registry = saved


def test_the_deployments_app_installs_its_registry(fresh_registry):
    assert isinstance(workers.get_registry(), DeploymentRegistry)


def test_without_an_installed_registry_the_gateway_says_what_is_missing(fresh_registry):
    workers._dynamic_registry = None
    with pytest.raises(ImproperlyConfigured, match="no registry is installed"):
        workers.get_registry()


def test_a_static_worker_list_needs_no_installed_registry(fresh_registry, settings):
    workers._dynamic_registry = None
    settings.TESSERA_WORKERS = "http://127.0.0.1:9/"
    registry = workers.get_registry()
    assert type(registry) is workers.Registry and [w.url for w in registry.workers] == ["http://127.0.0.1:9"]
