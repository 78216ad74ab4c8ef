"""Schemathesis over the management API's own OpenAPI schema (/api/v1/schema/, drf-spectacular): every
operation, generated bodies, query strings and path parameters, sent with an operator's credentials
(a superuser over basic auth). Never a 5xx. Seeded and bounded (SCHEMATHESIS_EXAMPLES per
operation) so it fits in about a minute of CI."""

from __future__ import annotations

import base64
import os

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "8"))
OPERATOR = ("fuzz-operator", "fuzz-password")

schema = schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", get_wsgi_application())


@pytest.fixture
def operator_headers(transactional_db):  # a refused value aborts a PostgreSQL transaction: no shared one
    from django.contrib.auth.models import User
    from django.core import signals
    from django.db import close_old_connections

    from tenants import services

    User.objects.create_superuser(OPERATOR[0], "op@example.com", OPERATOR[1])
    # Something for the path parameters to find: a tier, a tenant with a key.
    tier = services.tier_create(name="fuzz", priority=5)
    tenant = services.tenant_create(name="Fuzz", slug="fuzz", tier=tier)
    services.api_key_create(tenant=tenant, name="fuzz")
    token = base64.b64encode(f"{OPERATOR[0]}:{OPERATOR[1]}".encode()).decode()
    # As Django's test client does: the request must not close the connection holding the test's transaction.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield {"Authorization": f"Basic {token}"}
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors_with_operator_credentials(case, operator_headers):
    response = case.call(headers=operator_headers)
    assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text[:500])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/api/v1/slo/?tenant=%00", None),  # found by schemathesis: PostgreSQL refuses NUL (DataError, a 500)
        ("post", "/api/v1/deployments/", {"model": "\x00", "replicas": 1}),  # a SlugRelatedField lookup, the same
        ("get", "/api/v1/tenants/?limit=99999999999999999999999", None),
    ],
)
def test_values_the_database_refuses_are_400s(operator_headers, client, method, path, body):
    kwargs = {"content_type": "application/json", "data": body} if body is not None else {}
    response = getattr(client, method)(path, HTTP_AUTHORIZATION=operator_headers["Authorization"], **kwargs)
    assert response.status_code < 500, response.content[:300]
    if response.status_code == 400:
        assert "detail" in response.json()
