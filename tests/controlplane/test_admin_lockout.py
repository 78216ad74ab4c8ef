"""Admin sign-in lockout (django-axes, controlplane/doors/lockout.py) through Django's test client on
PostgreSQL: the issue's brute force, per-username and per-address counting, growing cool-downs,
the unlock command, the counters and the attacks on the counting itself."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from controlplane.slo.metrics import REGISTRY

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("admin", "admin@example.com", "right-password")


def _post(client: Client, username: str, password: str, ip: str = "198.51.100.7", **extra):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=ip, **extra)


def _signed_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/admin/"


def _sample(name: str, labels: dict | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_the_issues_brute_force_is_locked_after_the_limit(admin_user, settings):
    """60 wrong passwords for `admin` in a burst: 4 answered with the form, the rest with the lockout."""
    settings.TESSERA_LOGIN_FAILURE_LIMIT = 5
    failures_before = _sample("tessera_login_failures_total", {"door": "admin"})
    lockouts_before = _sample("tessera_login_lockouts_total", {"door": "admin"})
    client = Client()
    statuses = [_post(client, "admin", f"guess-{i}").status_code for i in range(60)]
    assert statuses[:4] == [200] * 4
    assert statuses[4:] == [429] * 56
    # Refused attempts are not recorded: the lockout neither grows nor lengthens under the hammering.
    assert sum(AccessAttempt.objects.filter(username="admin").values_list("failures_since_start", flat=True)) == 5
    assert _sample("tessera_login_failures_total", {"door": "admin"}) - failures_before == 60
    assert _sample("tessera_login_lockouts_total", {"door": "admin"}) - lockouts_before == 56
    response = _post(client, "admin", "right-password")
    assert response.status_code == 429 and not _signed_in(response)
    assert "Too many failed sign-ins" in response.content.decode()
    assert 0 < int(response["Retry-After"]) <= 300


def test_lockout_is_per_username_across_addresses(admin_user):
    """An attacker rotating addresses still locks the username (distributed guessing)."""
    for i in range(5):
        _post(Client(), "admin", "wrong", ip=f"203.0.113.{i + 1}")
    response = _post(Client(), "admin", "right-password", ip="192.0.2.200")
    assert response.status_code == 429


def test_lockout_is_per_address_across_usernames(admin_user, django_user_model):
    """One address spraying many usernames is locked for every username, the real one included."""
    django_user_model.objects.create_user("bob", password="bobs-password", is_staff=True)
    for i in range(5):
        _post(Client(), f"user{i}", "wrong", ip="198.51.100.50")
    assert _post(Client(), "bob", "bobs-password", ip="198.51.100.50").status_code == 429
    assert _signed_in(_post(Client(), "bob", "bobs-password", ip="198.51.100.51"))


def test_an_address_lock_does_not_shut_out_a_user_known_there(admin_user, django_user_model):
    """Names sprayed from a shared address (an office NAT, a fuzzer's invalid-credential probes) lock the
    address for everyone not seen there, but not for an operator who signed in from it: the operator
    stays under the username's own count, so the exception buys an attacker no guess."""
    django_user_model.objects.create_user("bob", password="bobs-password", is_staff=True)
    assert _signed_in(_post(Client(), "admin", "right-password", ip="198.51.100.80"))
    for i in range(5):
        _post(Client(), f"made-up-{i}", "wrong", ip="198.51.100.80")
    assert _post(Client(), "bob", "bobs-password", ip="198.51.100.80").status_code == 429  # never seen here
    assert _signed_in(_post(Client(), "admin", "right-password", ip="198.51.100.80"))
    # Guessing the known operator's password from the locked address: five guesses, then its own lockout.
    statuses = [_post(Client(), "admin", f"guess-{i}", ip="198.51.100.80").status_code for i in range(6)]
    assert statuses == [200] * 4 + [429] * 2
    response = _post(Client(), "admin", "right-password", ip="198.51.100.80")
    assert response.status_code == 429 and 0 < int(response["Retry-After"]) <= 300


def test_an_api_basic_sign_in_makes_its_user_known_at_the_address(admin_user):
    import base64

    from axes.models import AccessLog

    def basic(username, password):
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        return Client().get("/api/v1/tiers/", HTTP_AUTHORIZATION=f"Basic {token}", REMOTE_ADDR="198.51.100.131")

    assert basic("admin", "right-password").status_code == 200
    assert basic("admin", "right-password").status_code == 200
    assert AccessLog.objects.filter(username="admin", ip_address="198.51.100.131").count() == 1  # not one a request
    for i in range(5):
        assert basic(f"SCHEMATHESIS-INVALID-{i}", "x").status_code in (401, 403, 429)
    assert basic("someone-else", "x").status_code == 429  # the address is locked ...
    assert basic("admin", "right-password").status_code == 200  # ... but not for the operator known there


def test_a_cooldown_ends_and_then_grows(admin_user, settings):
    settings.TESSERA_LOGIN_COOLOFF_SECONDS = 60
    for _ in range(5):
        _post(Client(), "admin", "wrong")
    assert _post(Client(), "admin", "right-password").status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(seconds=61))  # the minute has passed
    response = _post(Client(), "admin", "wrong")  # one more failure: locked again at once, for twice as long
    assert response.status_code == 429
    assert 100 < int(response["Retry-After"]) <= 121
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(seconds=121))
    assert _signed_in(_post(Client(), "admin", "right-password"))


def test_a_successful_sign_in_forgets_only_its_own_failures(admin_user, django_user_model):
    """Logging in to one's own account must not wipe what the address built up against another."""
    django_user_model.objects.create_user("mallory", password="mallorys", is_staff=True)
    for _ in range(4):
        _post(Client(), "admin", "wrong", ip="198.51.100.66")
    assert _signed_in(_post(Client(), "mallory", "mallorys", ip="198.51.100.66"))
    assert _post(Client(), "admin", "wrong", ip="198.51.100.66").status_code == 429


def test_unlock_from_the_command_line(admin_user):
    for _ in range(5):
        _post(Client(), "admin", "wrong")
    assert _post(Client(), "admin", "right-password").status_code == 429
    out = io.StringIO()
    call_command("login_unlock", "--username", "admin", stdout=out)
    assert json.loads(out.getvalue())["cleared_rows"] >= 1
    assert _signed_in(_post(Client(), "admin", "right-password"))


def test_an_operator_unlocks_from_the_admin(admin_user, make_user):
    from axes.models import AccessLog

    operator = make_user("ops", role="operator")
    for _ in range(5):
        _post(Client(), "admin", "wrong")
    assert _post(Client(), "admin", "right-password").status_code == 429
    client = Client()
    client.force_login(operator)
    listing = client.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "admin" in listing.content.decode()
    attempt = AccessAttempt.objects.get(username="admin")
    response = client.post(f"/admin/axes/accessattempt/{attempt.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert _signed_in(_post(Client(), "admin", "right-password"))
    assert AccessLog.objects.filter(username="admin").exists()  # the successful sign-in is on record


def test_unlock_by_address(admin_user):
    for i in range(5):
        _post(Client(), f"nobody{i}", "wrong", ip="198.51.100.77")
    assert _post(Client(), "admin", "right-password", ip="198.51.100.77").status_code == 429
    call_command("login_unlock", "--ip", "::ffff:198.51.100.77", stdout=io.StringIO())  # any spelling of it
    assert _signed_in(_post(Client(), "admin", "right-password", ip="198.51.100.77"))


def test_ipv6_addresses_count_per_64(admin_user):
    """Rotating through one /64 (which a single host is given) does not reset the address's count."""
    for i in range(5):
        _post(Client(), f"v6user{i}", "wrong", ip=f"2001:db8:1:2::{i + 1:x}")
    assert _post(Client(), "admin", "right-password", ip="2001:db8:1:2:ffff::9").status_code == 429
    assert _signed_in(_post(Client(), "admin", "right-password", ip="2001:db8:1:3::1"))
    call_command("login_unlock", "--ip", "2001:db8:1:2::abcd", stdout=io.StringIO())
    assert _signed_in(_post(Client(), "admin", "right-password", ip="2001:db8:1:2::1"))


def test_unlock_refuses_nonsense():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("login_unlock", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("login_unlock", "--ip", "not-an-address", stdout=io.StringIO())


def test_forwarded_for_counts_only_behind_a_trusted_proxy(admin_user, settings):
    # No trusted hop: a client writing X-Forwarded-For is still counted under its own socket address.
    for i in range(5):
        _post(Client(), f"x{i}", "wrong", ip="198.51.100.90", HTTP_X_FORWARDED_FOR=f"10.9.9.{i}")
    assert _post(Client(), "admin", "right-password", ip="198.51.100.90").status_code == 429
    # One trusted hop (the ingress): clients behind it are told apart by what it appended.
    settings.TESSERA_TRUSTED_PROXY_HOPS = 1
    for i in range(5):
        _post(Client(), f"y{i}", "wrong", ip="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.99")
    assert _post(Client(), "admin", "right-password", ip="10.0.0.2",
                 HTTP_X_FORWARDED_FOR="203.0.113.99").status_code == 429
    assert _signed_in(_post(Client(), "admin", "right-password", ip="10.0.0.2",
                            HTTP_X_FORWARDED_FOR="spoofed, 203.0.113.100"))


@pytest.mark.parametrize("username", ["a" * 5000, "nul\x00byte", "ünïcødé", " admin "])
def test_odd_usernames_are_refused_not_500(admin_user, username):
    for _ in range(6):
        response = _post(Client(), username, "wrong", ip="198.51.100.120")
        assert response.status_code in (200, 429), response.status_code


def test_api_basic_auth_is_under_the_same_lockout(admin_user):
    import base64

    def basic(password):
        token = base64.b64encode(f"admin:{password}".encode()).decode()
        return Client().get("/api/v1/tiers/", HTTP_AUTHORIZATION=f"Basic {token}", REMOTE_ADDR="198.51.100.130")

    for _ in range(5):
        assert basic("wrong").status_code in (401, 403, 429)
    response = basic("right-password")
    assert response.status_code == 429
    assert response.json()["code"] == "login_locked_out"


def test_a_single_sign_on_callback_is_neither_counted_nor_refused_by_a_locked_address(admin_user, rf):
    """An address locked by password guesses still lets its people through single sign-on (the
    provider has its own lockout); an SSO callback's failure is not a password guess."""
    from axes.handlers.proxy import AxesProxyHandler

    for i in range(5):
        _post(Client(), f"guess{i}", "wrong", ip="198.51.100.140")
    callback = rf.get("/sso/callback/", REMOTE_ADDR="198.51.100.140")
    assert AxesProxyHandler.is_allowed(callback, {"username": None, "nonce": "n", "code_verifier": "v"})
    password = rf.post(LOGIN, REMOTE_ADDR="198.51.100.140")
    assert not AxesProxyHandler.is_allowed(password, {"username": "admin", "password": "x", "nonce": "n"})


def test_metrics_show_the_counters_and_the_alert_rules_name_them(admin_user):
    from pathlib import Path

    import yaml

    for _ in range(5):
        _post(Client(), "admin", "wrong", ip="198.51.100.150")
    text = Client().get("/metrics").content.decode()
    rules = yaml.safe_load(Path("deploy/prometheus/tessera-doors-rules.yml").read_text())["groups"][0]["rules"]
    exprs = " ".join(rule["expr"] for rule in rules)
    for series in ("tessera_login_failures_total", "tessera_login_lockouts_total"):
        assert f'{series}{{door="admin"}}' in text and series in exprs
    assert "tessera_login_second_factor_failures_total" in text and "tessera_login_second_factor_failures_total" in exprs
