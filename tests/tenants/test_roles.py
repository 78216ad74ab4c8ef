"""Roles: the groups hold exactly their permissions, role_grant gives them, plain staff holds none."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command

from tenants.roles import FINANCE, OPERATOR, OPERATOR_APPS, roles_ensure, user_has_role

pytestmark = pytest.mark.django_db


def test_groups_exist_after_migrate_and_ensure_is_idempotent():
    operator, finance = Group.objects.get(name=OPERATOR), Group.objects.get(name=FINANCE)
    apps = set(operator.permissions.values_list("content_type__app_label", flat=True))
    assert apps == set(OPERATOR_APPS)
    assert {"change_tenant", "add_apikey", "change_tier", "change_deployment"} <= set(
        operator.permissions.values_list("codename", flat=True)
    )
    codes = set(finance.permissions.values_list("codename", flat=True))
    assert codes and all(code.startswith("view_") for code in codes)
    assert "view_apikey" not in codes and "view_tier" not in codes
    finance.permissions.clear()
    roles_ensure()
    assert set(finance.permissions.values_list("codename", flat=True)) == codes


def test_who_holds_which_role(make_user):
    assert not user_has_role(make_user("plain", is_staff=True), OPERATOR)
    assert not user_has_role(make_user("plain2", is_staff=True), FINANCE)
    finance = make_user("fin", role=FINANCE)
    assert user_has_role(finance, FINANCE) and not user_has_role(finance, OPERATOR)
    operator = make_user("op", role=OPERATOR)
    assert user_has_role(operator, OPERATOR) and user_has_role(operator, FINANCE)
    root = make_user("root", is_superuser=True)
    assert user_has_role(root, OPERATOR) and user_has_role(root, FINANCE)
    inactive = make_user("gone", role=OPERATOR, is_active=False)
    assert not user_has_role(inactive, OPERATOR)


def test_role_grant_command(make_user, django_user_model):
    make_user("alice")
    out = StringIO()
    call_command("role_grant", "--user", "alice", "--role", "finance", stdout=out)
    assert json.loads(out.getvalue()) == {"user": "alice", "is_staff": True, "is_superuser": False, "roles": ["finance"]}
    out = StringIO()
    call_command("role_grant", "--user", "alice", "--role", "operator", stdout=out)
    assert json.loads(out.getvalue())["roles"] == ["operator", "finance"]
    out = StringIO()
    call_command("role_grant", "--user", "alice", "--role", "operator", "--revoke", stdout=out)
    assert json.loads(out.getvalue())["roles"] == ["finance"]
    with pytest.raises(CommandError, match="no user"):
        call_command("role_grant", "--user", "nobody", "--role", "finance")
    with pytest.raises(CommandError):
        call_command("role_grant", "--user", "alice", "--role", "admin")
