"""Single sign-on against a real OpenID Connect provider (tests/controlplane/oidc_provider.py), through
Django's test client: users and roles, state and token checks, and matching by subject not email."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest

from tests.controlplane.sso_helpers import (
    callback,
    page_messages,
    point_at,
    provider,  # noqa: F401  (fixture)
    provider_answer,
    sign_in,
    to_provider,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def sso(settings, provider):  # noqa: F811
    point_at(settings, provider)
    return provider


def _user(sub: str):
    from controlplane.sso.models import OIDCIdentity

    return OIDCIdentity.objects.select_related("user").get(subject=sub).user


def _roles(user) -> set[str]:
    """The role groups the user is in (an operator also *holds* finance's view permissions)."""
    from tenants.roles import ROLES

    return set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))


def test_first_sign_in_creates_a_staff_user_with_the_mapped_role(client, sso):
    sso.user_claims.update(sub="ops-1", preferred_username="olga", groups=["platform-ops", "wiki-editors"],
                           given_name="Olga", email="olga@example.com")
    response = sign_in(client)
    assert response.status_code == 302 and response["Location"] == "/admin/", response.content[:300]
    user = _user("ops-1")
    assert user.username == "olga" and user.is_staff and not user.is_superuser
    assert not user.has_usable_password() and user.first_name == "Olga" and user.email == "olga@example.com"
    assert _roles(user) == {"operator"}
    assert client.session.get_expiry_age() == 8 * 3600  # TESSERA_OIDC_SESSION_SECONDS, not two weeks
    page = client.get("/admin/")
    assert page.status_code == 200 and b"Site administration" in page.content
    assert client.get("/admin/tenants/apikey/add/").status_code == 200


def test_next_is_kept_across_the_provider(client, sso):
    sso.user_claims.update(groups=["platform-ops"])
    response = sign_in(client, next_url="/admin/tenants/tenant/")
    assert response["Location"] == "/admin/tenants/tenant/"


@pytest.mark.parametrize("next_url", ["https://evil.example/", "//evil.example/admin/", "http:evil.example"])
def test_next_never_leaves_the_site(client, sso, next_url):
    sso.user_claims.update(groups=["platform-ops"])
    assert sign_in(client, next_url=next_url)["Location"] == "/admin/"


def test_roles_are_resynced_at_every_sign_in_and_a_removed_role_is_removed(client, sso):
    sso.user_claims.update(sub="p-2", groups=["platform-ops"])
    sign_in(client)
    user = _user("p-2")
    assert _roles(user) == {"operator"}

    client.logout()
    sso.user_claims["groups"] = ["finance-team"]
    assert sign_in(client)["Location"] == "/admin/"
    assert _roles(user) == {"finance"}
    assert client.get("/admin/tenants/apikey/add/").status_code == 403
    assert client.get("/admin/billing/invoice/").status_code == 200

    client.logout()
    sso.user_claims["groups"] = ["wiki-editors"]  # every mapped group taken away at the provider
    response = sign_in(client)
    assert response["Location"] == "/admin/login/"
    user.refresh_from_db()
    assert _roles(user) == set() and not user.is_staff and user.groups.count() == 0
    assert "no longer holds a role" in page_messages(client)
    assert client.get("/admin/").status_code == 302  # not signed in


def test_a_person_with_no_mapped_role_is_refused_and_no_account_is_made(client, sso, django_user_model):
    sso.user_claims.update(sub="nobody-1", groups=["engineering"])
    before = django_user_model.objects.count()
    response = sign_in(client)
    assert response["Location"] == "/admin/login/"
    assert "holds no role on this platform" in page_messages(client)
    assert django_user_model.objects.count() == before
    assert client.get("/admin/").status_code == 302


def test_keycloak_style_nested_role_claim(client, sso, settings):
    settings.TESSERA_OIDC_ROLE_CLAIM = "realm_access.roles"
    sso.user_claims.update(sub="kc-1", groups=[], realm_access={"roles": ["finance-team", "offline_access"]})
    assert sign_in(client)["Location"] == "/admin/"
    assert _roles(_user("kc-1")) == {"finance"}


def test_a_tampered_state_is_refused(client, sso):
    sso.user_claims.update(groups=["platform-ops"])
    answer = provider_answer(to_provider(client))
    parts = urlsplit(answer)
    query = parse_qs(parts.query)
    tampered = urlunsplit(parts._replace(query=urlencode({"code": query["code"][0], "state": "x" + query["state"][0]})))
    assert callback(client, tampered).status_code == 400
    assert client.get("/admin/").status_code == 302
    assert sso.token_requests == 0  # refused before the code was ever exchanged


def test_a_callback_is_single_use(client, sso):
    sso.user_claims.update(groups=["platform-ops"])
    answer = provider_answer(to_provider(client))
    assert callback(client, answer)["Location"] == "/admin/"
    assert callback(client, answer).status_code == 400  # the state was consumed by the first


def test_a_callback_from_another_browser_signs_nobody_in(client, sso, django_user_model):
    """Login CSRF: a victim's browser handed an attacker's code and state must not be signed in."""
    from django.test import Client

    sso.user_claims.update(groups=["platform-ops"])
    attacker_answer = provider_answer(to_provider(Client()))
    victim = client
    response = callback(victim, attacker_answer)
    assert response["Location"] == "/admin/login/"
    assert victim.get("/admin/").status_code == 302 and sso.token_requests == 0


def test_matching_is_by_subject_never_by_email(client, sso, django_user_model):
    """A provider account naming the local superuser's username and (verified) email gets its own account."""
    admin = django_user_model.objects.create_superuser("person", "person@example.com", "pw")
    sso.user_claims.update(sub="other-sub", preferred_username="person", email="person@example.com",
                           email_verified=True, groups=["finance-team"])
    assert sign_in(client)["Location"] == "/admin/"
    user = _user("other-sub")
    assert user.pk != admin.pk and user.username.startswith("person-") and not user.is_superuser
    assert client.get("/admin/tenants/apikey/add/").status_code == 403  # finance, not the superuser
    admin.refresh_from_db()
    assert admin.groups.count() == 0 and admin.has_usable_password()


def test_an_unverified_email_is_not_copied(client, sso):
    sso.user_claims.update(sub="u-3", email="ceo@example.com", email_verified=False, groups=["finance-team"])
    sign_in(client)
    assert _user("u-3").email == ""


@pytest.mark.parametrize("attack", [
    {"id_token_overrides": {"aud": ["another-client"]}},
    {"id_token_overrides": {"iss": "http://127.0.0.1:1/other-issuer"}},
    {"sign_with_foreign_key": True},
    {"userinfo_overrides": {"sub": "someone-else"}},
    {"id_token_overrides": {"exp": 1_000_000_000}},
    {"id_token_overrides": {"nonce": "not-the-one-this-session-sent"}},
], ids=["audience", "issuer", "unpublished-key", "userinfo-subject", "expired", "nonce"])
def test_answers_that_do_not_verify_sign_nobody_in(client, sso, attack, django_user_model):
    sso.user_claims.update(sub="victim", groups=["platform-ops"])
    for name, value in attack.items():
        setattr(sso, name, value)
    before = django_user_model.objects.count()
    response = sign_in(client)
    assert response["Location"] == "/admin/login/"
    assert "did not verify" in page_messages(client)
    assert django_user_model.objects.count() == before and client.get("/admin/").status_code == 302


def test_the_provider_refusing_is_reported(client, sso):
    sso.deny = True
    answer = provider_answer(to_provider(client))
    assert "error=access_denied" in answer
    assert callback(client, answer)["Location"] == "/admin/login/"
    assert "did not sign you in (access_denied)" in page_messages(client)


def test_a_deactivated_account_is_refused(client, sso):
    sso.user_claims.update(sub="gone-1", groups=["platform-ops"])
    sign_in(client)
    client.logout()
    user = _user("gone-1")
    user.is_active = False
    user.save()
    assert sign_in(client)["Location"] == "/admin/login/"
    assert "deactivated" in page_messages(client)
    assert client.get("/admin/").status_code == 302


def test_a_discovery_document_for_another_issuer_is_refused(client, sso, settings):
    settings.TESSERA_OIDC_ISSUER = sso.issuer.replace("127.0.0.1", "localhost")  # the document names 127.0.0.1
    response = client.get("/sso/login/")
    assert response["Location"] == "/admin/login/"
    assert "cannot be reached" in page_messages(client)


def test_a_provider_that_does_not_answer_is_reported(client, sso):
    sso.stop()
    assert client.get("/sso/login/")["Location"] == "/admin/login/"
    assert "cannot be reached" in page_messages(client)


def test_a_token_endpoint_that_stops_answering_mid_sign_in_is_reported(client, sso):
    sso.user_claims.update(groups=["platform-ops"])
    answer = provider_answer(to_provider(client))
    sso.stop()
    assert callback(client, answer)["Location"] == "/admin/login/"
    assert "refused or did not answer" in page_messages(client)
    assert client.get("/admin/").status_code == 302


def test_explicit_endpoints_need_no_discovery(client, sso, settings):
    settings.TESSERA_OIDC_ISSUER = sso.issuer
    settings.TESSERA_OIDC_AUTHORIZATION_ENDPOINT = f"{sso.issuer}/authorize"
    settings.TESSERA_OIDC_TOKEN_ENDPOINT = f"{sso.issuer}/token"
    settings.TESSERA_OIDC_USERINFO_ENDPOINT = f"{sso.issuer}/userinfo"
    settings.TESSERA_OIDC_JWKS_ENDPOINT = f"{sso.issuer}/jwks"
    sso.user_claims.update(groups=["platform-ops"])
    assert sign_in(client)["Location"] == "/admin/"
    assert "/.well-known/openid-configuration" not in sso.paths_served


def test_client_secret_post_when_the_provider_wants_it(client, sso, settings):
    sso.client.auth_method = "client_secret_post"
    sso.user_claims.update(groups=["platform-ops"])
    assert sign_in(client)["Location"] == "/admin/login/"  # basic auth refused by this provider
    settings.TESSERA_OIDC_TOKEN_AUTH = "client_secret_post"
    assert sign_in(client)["Location"] == "/admin/"


def test_sso_is_off_until_configured(client, settings):
    settings.TESSERA_OIDC_ISSUER = ""
    assert client.get("/sso/login/").status_code == 404
    assert client.get("/sso/callback/?code=a&state=b").status_code == 404
    assert b"Sign in with SSO" not in client.get("/admin/login/").content


def test_role_map_naming_an_unknown_role_fails_the_system_check(settings):
    from controlplane.sso.config import settings_errors

    settings.TESSERA_OIDC_ROLE_MAP = {"platform-ops": "operators"}
    assert any("'operators'" in error for error in settings_errors())
    settings.TESSERA_OIDC_ROLE_MAP = {"platform-ops": "operator"}
    assert settings_errors() == []


def test_a_superuser_sees_the_identities_read_only(client, sso, django_user_model):
    sso.user_claims.update(sub="listed-1", preferred_username="lena", groups=["finance-team"])
    sign_in(client)
    client.logout()
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    page = client.get("/admin/sso/oidcidentity/")
    assert page.status_code == 200 and b"listed-1" in page.content and b"lena" in page.content
    assert client.get("/admin/sso/oidcidentity/add/").status_code == 403
