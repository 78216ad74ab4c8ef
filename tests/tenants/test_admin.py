"""Admin actions go through services: a key created in the admin is shown once and stored hashed."""

from __future__ import annotations

import pytest

from tenants import auth
from tenants.models import APIKey

pytestmark = pytest.mark.django_db


def test_admin_creates_keys_through_the_service_and_shows_the_secret_once(admin_client, make_tenant):
    tenant = make_tenant()
    response = admin_client.post(
        "/admin/tenants/apikey/add/",
        {"tenant": tenant.pk, "name": "from-admin", "allowed_models": '["m"]', "allowed_adapters": "[]"},
        follow=True,
    )
    assert response.status_code == 200
    messages = [str(m) for m in response.context["messages"]]
    secret = next(word for m in messages for word in m.split() if word.startswith("sk-"))
    key = APIKey.objects.get(name="from-admin")
    assert auth.authenticate(secret).key_id == key.pk and key.allowed_models == ["m"]
    page = admin_client.get(f"/admin/tenants/apikey/{key.pk}/change/").content.decode()
    assert secret not in page and key.key_hash not in page


def test_admin_actions_suspend_and_revoke(admin_client, make_tenant):
    from tenants import services

    tenant = make_tenant()
    created = services.api_key_create(tenant=tenant, name="k")
    admin_client.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [tenant.pk]})
    tenant.refresh_from_db()
    assert tenant.status == "suspended"
    admin_client.post("/admin/tenants/apikey/", {"action": "revoke", "_selected_action": [created.key.pk]})
    assert APIKey.objects.get(pk=created.key.pk).revoked
