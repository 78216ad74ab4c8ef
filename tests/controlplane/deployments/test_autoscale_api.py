"""min_replicas / max_replicas through the management API: bounds checked, roles enforced, bodies attacked."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from controlplane.audit.models import AuditEvent
from controlplane.deployments.models import Deployment

pytestmark = pytest.mark.django_db

URL = "/api/v1/deployments/"


@pytest.fixture
def op(operator):
    client = APIClient()
    client.force_login(operator)
    return client


@pytest.fixture
def deployed(op, make_model, sent):
    make_model()
    created = op.post(URL, {"model": "smollm2-135m-instruct", "replicas": 2, "min_replicas": 1, "max_replicas": 4},
                      format="json")
    assert created.status_code == 201, created.content
    return created.json()


def test_create_with_bounds_and_read_them_back(deployed, op):
    assert (deployed["min_replicas"], deployed["max_replicas"], deployed["replicas"]) == (1, 4, 2)
    assert deployed["autoscaler"] is None  # no pass yet
    shown = op.get(URL + "smollm2-135m-instruct/").json()
    assert shown["max_replicas"] == 4



def test_the_autoscalers_last_reading_is_shown_as_an_object(deployed, op, make_worker, commit):
    from controlplane.deployments import reconciler

    make_worker("w1")
    with commit():
        reconciler.reconcile()
    shown = op.get(URL + "smollm2-135m-instruct/").json()["autoscaler"]
    assert isinstance(shown, dict) and shown["reason"] and {"recommended", "signals", "ups", "downs"} <= set(shown)


def test_max_below_min_in_one_body_is_a_field_error(op, make_model, sent):
    make_model()
    refused = op.post(URL, {"model": "smollm2-135m-instruct", "min_replicas": 3, "max_replicas": 2}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"max_replicas": ["2 is below min_replicas 3."]}
    assert not Deployment.objects.exists()


def test_a_patch_of_one_bound_is_checked_against_the_stored_other(deployed, op):
    refused = op.patch(URL + "smollm2-135m-instruct/", {"min_replicas": 5}, format="json")
    assert refused.status_code == 400
    body = refused.json()
    assert body["code"] == "invalid_value" and body["param"] == "max_replicas" and "below min_replicas 5" in body["detail"]
    assert Deployment.objects.get().min_replicas == 1


@pytest.mark.parametrize("body", [{"max_replicas": 0}, {"min_replicas": -1}, {"max_replicas": "3\x00"},
                                  {"max_replicas": True}, {"min_replicas": 10**12}, {"max_replicas": [2]}])
def test_bad_values_are_refused(deployed, op, body):
    refused = op.patch(URL + "smollm2-135m-instruct/", body, format="json")
    assert refused.status_code == 400
    stored = Deployment.objects.get()
    assert (stored.min_replicas, stored.max_replicas) == (1, 4)


def test_a_nul_byte_in_the_body_is_refused_and_nothing_changes(deployed, op):
    raw = '{"max_replicas": 3, "min_replicas": 1, "placement": {"accelerator": "h\\u0000100"}}'
    refused = op.generic("PATCH", URL + "smollm2-135m-instruct/", raw, content_type="application/json")
    assert refused.status_code == 400 and refused.json()["param"] == "placement"  # alike on SQLite and PostgreSQL
    raw = '{"model": "smollm2-135m-instruct\\u0000", "max_replicas": 3}'
    assert op.generic("POST", URL, raw, content_type="application/json").status_code == 400
    stored = Deployment.objects.get()
    assert (stored.max_replicas, stored.placement) == (4, {})


def test_replicas_stay_within_the_bounds_and_null_turns_autoscaling_off(deployed, op):
    clamped = op.patch(URL + "smollm2-135m-instruct/", {"replicas": 9}, format="json").json()
    assert clamped["replicas"] == 4
    off = op.patch(URL + "smollm2-135m-instruct/", {"max_replicas": None}, format="json").json()
    assert off["max_replicas"] is None and off["replicas"] == 4
    assert op.patch(URL + "smollm2-135m-instruct/", {"replicas": 9}, format="json").json()["replicas"] == 9
    changes = [e.changes for e in AuditEvent.objects.filter(action="deployment.update").order_by("id")]
    assert {"max_replicas": [4, None]} in changes


@pytest.mark.parametrize("role", ["staff", "finance"])
def test_roles_below_operator_cannot_change_the_bounds(deployed, make_user, role):
    user = make_user(role, is_staff=True) if role == "staff" else make_user(role, role="finance")
    client = APIClient()
    client.force_login(user)
    refused = client.patch(URL + "smollm2-135m-instruct/", {"min_replicas": 0, "max_replicas": 100}, format="json")
    assert refused.status_code == 403
    stored = Deployment.objects.get()
    assert (stored.min_replicas, stored.max_replicas) == (1, 4)


def test_a_tenant_key_cannot_change_the_bounds(deployed, make_tenant):
    _, created = make_tenant()
    client = APIClient()
    body = json.dumps({"max_replicas": 100})
    refused = client.generic("PATCH", URL + "smollm2-135m-instruct/", body, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {created.secret}")
    assert refused.status_code in (401, 403)
    assert Deployment.objects.get().max_replicas == 4


def test_the_deploy_command_sets_and_clears_the_bounds(sent, capsys):
    from django.core.management import CommandError, call_command

    call_command("deploy", "--model", "smollm2-135m-instruct", "--replicas", "1", "--min-replicas", "0",
                 "--max-replicas", "3")
    out = json.loads(capsys.readouterr().out)["deployment"]
    assert (out["min_replicas"], out["max_replicas"], out["replicas"]) == (0, 3, 1)
    with pytest.raises(CommandError, match="below min_replicas 2"):
        call_command("deploy", "--model", "smollm2-135m-instruct", "--min-replicas", "2", "--max-replicas", "1")
    call_command("deploy", "--model", "smollm2-135m-instruct", "--replicas", "5", "--max-replicas", "none")
    out = json.loads(capsys.readouterr().out)["deployment"]
    assert (out["max_replicas"], out["replicas"]) == (None, 5)
