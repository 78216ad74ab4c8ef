"""The admin agrees with the roles: operators change keys (can_manage included); finance and plain staff cannot
change tenants, keys, tiers or deployments."""

from __future__ import annotations

import pytest
from django.test import Client

from tenants import auth, services
from tenants.models import APIKey

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def change_form(key: APIKey, **changes) -> dict:
    """The API key change form as the admin renders it (unticked checkboxes are simply absent)."""
    data = {
        "name": key.name,
        "allowed_models": "[]" if not key.allowed_models else str(key.allowed_models).replace("'", '"'),
        "allowed_adapters": "[]",
        "expires_at_0": "",
        "expires_at_1": "",
    }
    if key.can_manage:
        data["can_manage"] = "on"
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize("who", ["operator", "superuser"])
def test_the_can_manage_checkbox_saves(make_tenant, make_user, who):
    user = make_user("op", role="operator") if who == "operator" else make_user("root", is_staff=True, is_superuser=True)
    client = logged_in(user)
    created = services.api_key_create(tenant=make_tenant(), name="k")
    url = f"/admin/tenants/apikey/{created.key.pk}/change/"
    assert 'name="can_manage"' in client.get(url).content.decode()  # editable, not read-only

    response = client.post(url, change_form(created.key, can_manage="on"))
    assert response.status_code == 302, response.content.decode()[:2000]
    created.key.refresh_from_db()
    assert created.key.can_manage is True
    assert auth.authenticate(created.secret).can_manage is True  # the gateway's cache sees it at once

    response = client.post(url, change_form(created.key, can_manage=None))
    assert response.status_code == 302
    created.key.refresh_from_db()
    assert created.key.can_manage is False


@pytest.mark.parametrize("role", ["finance", None])
def test_finance_and_plain_staff_cannot_change_tenants_keys_tiers_or_deployments(make_tenant, make_user, role):
    tenant = make_tenant()
    created = services.api_key_create(tenant=tenant, name="k")
    client = logged_in(make_user("someone", role=role, is_staff=True))
    for url in (
        f"/admin/tenants/apikey/{created.key.pk}/change/",
        f"/admin/tenants/tier/{tenant.tier.pk}/change/",
        "/admin/tenants/apikey/add/",
        "/admin/tenants/tier/add/",
        "/admin/tenants/tenant/add/",
        "/admin/deployments/deployment/add/",
        "/admin/deployments/model/add/",
    ):
        assert client.get(url).status_code == 403, url
    assert client.post(f"/admin/tenants/apikey/{created.key.pk}/change/", change_form(created.key, can_manage="on")).status_code == 403
    created.key.refresh_from_db()
    assert created.key.can_manage is False
    # Tenants: finance may view (names for billing), never change; plain staff not even view.
    page = client.get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    if role == "finance":
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    else:
        assert page.status_code == 403
    response = client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", {"name": "renamed", "tier": tenant.tier.pk})
    assert response.status_code == 403
    response = client.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [tenant.pk]})
    tenant.refresh_from_db()
    assert tenant.name != "renamed" and tenant.status == "active"
    assert response.status_code in (200, 302, 403)


def test_operators_can_change_tenants_in_the_admin(make_tenant, make_user):
    tenant = make_tenant()
    client = logged_in(make_user("op", role="operator"))
    client.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [tenant.pk]})
    tenant.refresh_from_db()
    assert tenant.status == "suspended"
