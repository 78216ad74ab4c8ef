"""Two-factor for staff (controlplane/doors): the two-step admin sign-in, per-role enforcement,
enrolment, recovery codes, the API's session and basic authentication, and the single sign-on hook.
Django's test client on PostgreSQL; what a person sees in Chromium is in test_admin_2fa_browser.py."""

from __future__ import annotations

import base64
import io
import json
import time

import pytest
from django.core.management import call_command
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from controlplane.doors import twofactor

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"


def code_for(device: TOTPDevice, offset_steps: int = 0) -> str:
    device.refresh_from_db()
    return f"{totp(device.bin_key, device.step, device.t0, device.digits, device.drift + offset_steps):06d}"


def password_step(client: Client, username: str, password: str = "pw", next_url: str = "/admin/"):
    return client.post(f"/admin/login/?next={next_url}", {"username": username, "password": password})


@pytest.fixture
def two_factor_for_operators(settings):
    settings.TESSERA_ADMIN_2FA_ROLES = ["operator"]
    settings.OTP_TOTP_THROTTLE_FACTOR = 0  # wrong codes are tested without waiting; throttling has its own test
    settings.OTP_STATIC_THROTTLE_FACTOR = 0


@pytest.fixture
def enrolled(make_user):
    """A staff user holding no role, with an authenticator and recovery codes (enrolled by an operator)."""
    user = make_user("carol", is_staff=True)
    device, codes = twofactor.otp_enrol(user)
    return user, device, codes


def test_password_alone_signs_nobody_in_when_a_device_exists(enrolled, settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    user, device, _ = enrolled
    client = Client()
    response = password_step(client, "carol")
    assert response.status_code == 302 and response["Location"] == "/admin/login/code/"
    assert client.get("/admin/").status_code == 302  # nothing logged in between the steps
    assert "_auth_user_id" not in client.session
    assert client.post("/admin/login/code/", {"code": "000000" if code_for(device) != "000000" else "111111"}
                       ).status_code == 400
    response = client.post("/admin/login/code/", {"code": code_for(device)})
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_a_code_is_good_once(enrolled):
    user, device, _ = enrolled
    first = Client()
    password_step(first, "carol")
    code = code_for(device)
    assert first.post("/admin/login/code/", {"code": code}).status_code == 302
    second = Client()
    password_step(second, "carol")
    assert second.post("/admin/login/code/", {"code": code}).status_code == 400  # replayed


def test_a_recovery_code_works_once(enrolled, settings):
    settings.OTP_STATIC_THROTTLE_FACTOR = 0
    _, _, codes = enrolled
    client = Client()
    password_step(client, "carol")
    assert client.post("/admin/login/code/", {"code": codes[0].upper()}).status_code == 302  # case is forgiven
    again = Client()
    password_step(again, "carol")
    assert again.post("/admin/login/code/", {"code": codes[0]}).status_code == 400
    assert again.post("/admin/login/code/", {"code": codes[1]}).status_code == 302


def test_wrong_codes_are_throttled_and_count_toward_the_lockout(enrolled, settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 1
    _, device, _ = enrolled
    client = Client()
    password_step(client, "carol")
    wrong = f"{(int(code_for(device)) + 1) % 1000000:06d}"
    assert client.post("/admin/login/code/", {"code": wrong}).status_code == 400
    response = client.post("/admin/login/code/", {"code": code_for(device)})  # right, but inside the throttle
    assert response.status_code == 400 and "wait" in response.content.decode()
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    for _ in range(2):
        assert client.post("/admin/login/code/", {"code": wrong}).status_code == 400
    response = client.post("/admin/login/code/", {"code": wrong})  # the 5th refused code reaches the limit
    assert response.status_code == 429 and "Too many failed sign-ins" in response.content.decode()
    # The half-finished sign-in is dropped: even the right code now needs the password again.
    assert client.post("/admin/login/code/", {"code": code_for(device)})["Location"] == "/admin/login/"
    assert password_step(Client(), "carol").status_code == 429  # the username is locked for passwords too
    # What axes keeps of the refused codes shows neither the codes nor the password.
    from axes.models import AccessAttempt

    kept = " ".join(AccessAttempt.objects.values_list("post_data", flat=True))
    assert wrong not in kept and "code=****" in kept and "pw" not in kept.replace("password", "")


def test_an_operator_without_a_device_cannot_reach_the_admin_until_enrolled(two_factor_for_operators, make_user):
    make_user("ops", role="operator")
    client = Client()
    response = password_step(client, "ops")
    assert response["Location"] == "/admin/login/enrol/"
    assert client.get("/admin/tenants/tenant/").status_code == 302
    page = client.get("/admin/login/enrol/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "otpauth://totp/" in body and "<svg" in body
    device = TOTPDevice.objects.get(user__username="ops", confirmed=False)
    assert client.post("/admin/login/enrol/", {"code": "12345"}).status_code == 400
    response = client.post("/admin/login/enrol/", {"code": code_for(device)})
    assert response.status_code == 200
    codes = response.context["codes"]
    assert len(codes) == 10 and all(code in response.content.decode() for code in codes)
    assert client.get("/admin/tenants/tenant/").status_code == 200
    # Enrolled: the next sign-in asks for the code, and the enrolment page is gone.
    later = Client()
    assert password_step(later, "ops")["Location"] == "/admin/login/code/"
    assert later.get("/admin/login/enrol/")["Location"] == "/admin/login/code/"


def test_a_key_seen_by_one_session_is_never_the_key_another_confirms(two_factor_for_operators, make_user):
    """Someone holding an unenrolled operator's password opens the enrolment page and keeps the key;
    the operator's own enrolment gets a new key, and the first one no longer signs anyone in."""
    make_user("ops", role="operator")
    attacker, owner = Client(), Client()
    password_step(attacker, "ops")
    attacker.get("/admin/login/enrol/")
    seen = TOTPDevice.objects.get(user__username="ops", confirmed=False)
    password_step(owner, "ops")
    owner.get("/admin/login/enrol/")
    mine = TOTPDevice.objects.get(user__username="ops", confirmed=False)
    assert mine.pk != seen.pk and mine.key != seen.key
    assert owner.post("/admin/login/enrol/", {"code": code_for(mine)}).status_code == 200
    # The attacker's page is stale: the old key is gone, a fresh page (not a sign-in) comes back.
    response = attacker.post("/admin/login/enrol/", {"code": f"{totp(seen.bin_key):06d}"})
    assert response["Location"] == "/admin/login/code/"  # the user has an authenticator now
    assert "_auth_user_id" not in attacker.session


def test_enrolment_can_be_left_to_operators(two_factor_for_operators, make_user, settings):
    settings.TESSERA_ADMIN_2FA_SELF_ENROL = False
    make_user("ops", role="operator")
    client = Client()
    password_step(client, "ops")
    response = client.get("/admin/login/enrol/")
    assert response.status_code == 403 and "otp_enrol" in response.content.decode()
    assert not TOTPDevice.objects.filter(user__username="ops").exists()


def test_roles_not_listed_sign_in_with_a_password(two_factor_for_operators, make_user):
    make_user("money", role="finance")
    client = Client()
    assert password_step(client, "money")["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_superusers_hold_every_role_so_they_need_the_code(two_factor_for_operators, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    assert password_step(Client(), "root")["Location"] == "/admin/login/enrol/"


def test_a_session_without_its_second_factor_is_refused_everywhere(two_factor_for_operators, make_user):
    """A session from before the policy (or a forged half step) reaches neither the admin nor the API."""
    user = make_user("ops", role="operator")
    client = Client()
    client.force_login(user)
    response = client.get("/admin/tenants/tenant/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert client.get("/api/v1/tiers/").status_code in (401, 403)
    # Opening the sign-in page with that session goes straight to the missing step.
    assert client.get("/admin/login/")["Location"] == "/admin/login/enrol/"


def test_basic_auth_is_refused_for_a_user_who_needs_a_second_factor(two_factor_for_operators, make_user):
    make_user("ops", role="operator")
    make_user("money", role="finance")

    def basic(name):
        token = base64.b64encode(f"{name}:pw".encode()).decode()
        return Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Basic {token}")

    assert basic("ops").status_code == 401
    assert basic("money").status_code != 401


def test_the_single_sign_on_hook_counts_as_verified(two_factor_for_operators, make_user, rf):
    from django.contrib.sessions.backends.db import SessionStore

    user = make_user("ops", role="operator")
    client = Client()
    client.force_login(user)
    session = SessionStore(session_key=client.session.session_key)
    session[twofactor.IDP_VERIFIED_SESSION_KEY] = user.pk
    session.save()
    assert client.get("/admin/tenants/tenant/").status_code == 200
    assert client.get("/api/v1/tiers/").status_code == 200
    # The flag is bound to the user: another user's session carrying it is not verified.
    other = make_user("ops2", role="operator")
    client.force_login(other)
    session = SessionStore(session_key=client.session.session_key)
    session[twofactor.IDP_VERIFIED_SESSION_KEY] = user.pk
    session.save()
    assert client.get("/admin/tenants/tenant/").status_code == 302


def test_the_pending_step_expires(enrolled, monkeypatch):
    _, device, _ = enrolled
    client = Client()
    password_step(client, "carol")
    real = time.time
    monkeypatch.setattr("controlplane.doors.views.time.time", lambda: real() + 301)
    response = client.post("/admin/login/code/", {"code": code_for(device)})
    assert response.status_code == 302 and response["Location"] == "/admin/login/"
    assert "_auth_user_id" not in client.session


def test_the_code_step_never_redirects_off_site(enrolled):
    _, device, _ = enrolled
    client = Client()
    password_step(client, "carol", next_url="https://evil.example/")
    assert client.post("/admin/login/code/", {"code": code_for(device)})["Location"] == "/admin/"


@pytest.mark.parametrize("junk", ["", " ", "x" * 10000, "\x00\x00\x00\x00\x00\x00", "12345678901234", "ääääää"])
def test_junk_codes_are_refused(enrolled, junk, settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    client = Client()
    password_step(client, "carol")
    assert client.post("/admin/login/code/", {"code": junk}).status_code == 400


def test_the_code_step_without_a_password_is_the_login_page():
    assert Client().post("/admin/login/code/", {"code": "123456"})["Location"] == "/admin/login/"
    assert Client().get("/admin/login/enrol/")["Location"] == "/admin/login/"


def test_operator_enrolment_from_the_command_line(make_user, settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    make_user("dave", is_staff=True)
    out = io.StringIO()
    call_command("otp_enrol", "--username", "dave", stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["otpauth_uri"].startswith("otpauth://totp/") and len(printed["recovery_codes"]) == 10
    client = Client()
    assert password_step(client, "dave")["Location"] == "/admin/login/code/"
    assert client.post("/admin/login/code/", {"code": printed["recovery_codes"][3]}).status_code == 302
    call_command("otp_enrol", "--username", "dave", "--reset", stdout=io.StringIO())
    assert password_step(Client(), "dave")["Location"] == "/admin/"  # no device, no role listed: password only


def test_a_misspelt_role_is_a_system_check_error(settings):
    from controlplane.doors.apps import check_two_factor_roles

    settings.TESSERA_ADMIN_2FA_ROLES = ["operater"]
    assert [error.id for error in check_two_factor_roles()] == ["doors.E001"]
    settings.TESSERA_ADMIN_2FA_ROLES = ["operator", "finance"]
    assert check_two_factor_roles() == []
