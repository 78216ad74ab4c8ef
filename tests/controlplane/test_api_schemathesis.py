"""Schemathesis over the management API's own OpenAPI schema (/api/v1/schema/, drf-spectacular): every
operation, generated bodies, query strings and path parameters, sent with an operator's credentials
(a superuser over basic auth), then its stateful phase: sequences of calls that follow the links
schemathesis infers (a tier created, then read and changed; a list, then its items), with its
invalid-credential probe beside every success. Never a 5xx, and the operator is never locked out by
the probes' failures. Seeded and bounded (SCHEMATHESIS_EXAMPLES per operation,
SCHEMATHESIS_SCENARIOS per suite); the stateful phase on both databases (the child run at the end)."""

from __future__ import annotations

import base64
import collections
import os

import hypothesis
import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import ignored_auth, response_schema_conformance

from .other_database import run_on_other_database

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "8"))
SCENARIOS = int(os.environ.get("SCHEMATHESIS_SCENARIOS", "25"))
CHILD = "TESSERA_SCHEMATHESIS_OTHER_DATABASE"  # set in the child run: it must not start another
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
    # A documented answer has the documented shape (the paged lists were once called bare arrays).
    case.validate_response(response, checks=[response_schema_conformance], headers=operator_headers)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/api/v1/slo/?tenant=%00", None),  # found by schemathesis: PostgreSQL refuses NUL (DataError, a 500)
        ("post", "/api/v1/deployments/", {"model": "\x00", "replicas": 1}),  # a SlugRelatedField lookup, the same
        ("get", "/api/v1/tenants/?limit=99999999999999999999999", None),
        ("get", "/api/v1/tenants/?offset=99999999999999999999999", None),  # SQLite: "datatype mismatch", a 500
        ("get", "/api/v1/deployments/?limit=99999999999999999999999&offset=9223372036854775808", None),
        ("get", "/api/v1/audit-events/export.csv?limit=99999999999999999999999", None),
    ],
)
def test_values_the_database_refuses_are_400s(operator_headers, client, method, path, body):
    kwargs = {"content_type": "application/json", "data": body} if body is not None else {}
    response = getattr(client, method)(path, HTTP_AUTHORIZATION=operator_headers["Authorization"], **kwargs)
    assert response.status_code < 500, response.content[:300]
    if response.status_code == 400:  # DRF's shapes: {"detail": ...} or {field: [messages]} (SQLite's lookup finds no row)
        body = response.json()
        assert "detail" in body or (body and all(isinstance(v, list) for v in body.values())), body


def test_a_stateful_workflow_as_an_operator(operator_headers, monkeypatch):
    """The stateful phase that a run against `make run` never reached. Each success is followed by
    schemathesis' `ignored_auth` probe (the same call with no and with invalid credentials), so the
    client's address collects failed sign-ins for made-up names and is locked for names never seen
    there; the operator, signed in from it, must go on being answered (controlplane/doors/lockout.py)."""
    from axes.models import AccessAttempt
    from schemathesis.specs.openapi import checks

    # Once the address is locked, a probe's invalid credentials get the lockout's 429: as much a refusal as a 401.
    monkeypatch.setattr(checks, "AUTH_REJECTION_STATUSES", frozenset({*checks.AUTH_REJECTION_STATUSES, 429}))
    seen: collections.Counter = collections.Counter()

    class Workflow(schema.as_state_machine()):
        def get_call_kwargs(self, case):  # the address a real client has (the probes are sent with it too)
            return {"headers": operator_headers, "environ_base": {"REMOTE_ADDR": "127.0.0.1"}}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            seen[(case.method, case.path, response.status_code)] += 1
            assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text[:500])
            assert response.status_code != 429, ("the operator was locked out", case.method, case.formatted_path,
                                                 response.text[:300])
            case.validate_response(response, checks=[not_a_server_error, ignored_auth, response_schema_conformance],
                                   headers=operator_headers,
                                   transport_kwargs=kwargs)

    run = settings(max_examples=SCENARIOS, stateful_step_count=8, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    suites = 0
    for seed in range(6):
        # The database outlives each scenario, so Hypothesis may find a replay that draws differently
        # (Flaky): as schemathesis' own runner does, start the suite again under the next seed.
        try:
            hypothesis.seed(seed)(Workflow).run(settings=run)
            suites += 1
        except Flaky:
            continue
        if suites == 2:
            break
    assert suites == 2, seen
    # It went through links, not only single calls: tiers it created were read and changed.
    assert seen[("POST", "/api/v1/tiers/", 201)] > 0, seen
    assert seen[("GET", "/api/v1/tiers/{name}/", 200)] + seen[("PATCH", "/api/v1/tiers/{name}/", 200)] > 0, seen
    # And the probes did lock the address for everyone else.
    failures = sum(AccessAttempt.objects.filter(ip_address="127.0.0.1").values_list("failures_since_start", flat=True))
    assert failures >= 5, failures


@pytest.mark.skipif(bool(os.environ.get(CHILD)), reason="the child run is the other database already")
@pytest.mark.django_db(transaction=False)
def test_the_same_fuzz_on_the_other_database(settings):
    """The stateful workflow and the refused values again, in a child pytest on the other backend:
    SQLite when this run has PostgreSQL (CI), PostgreSQL when this run has SQLite and a server answers.
    (The per-operation fuzz stays on the first: it doubled the module's time for no find of its own.)"""
    run_on_other_database(settings, __file__, selection="stateful or refuses", child_flag=CHILD)
