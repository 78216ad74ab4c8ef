"""The management API's HTTP Basic sign-in remembers a verified password for a minute
(controlplane/doors/basic_cache.py): the second call skips the password hasher, and nothing that
would refuse the full check is skipped with it (a changed password, a deactivated user, password
sign-in turned off, a lockout, a wrong password)."""

from __future__ import annotations

import base64

import pytest
from django.contrib.auth import hashers
from django.test import Client

from controlplane.doors import basic_cache

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model):
    basic_cache.forget_all()
    yield django_user_model.objects.create_superuser("ops", "ops@example.com", "right-password")
    basic_cache.forget_all()


@pytest.fixture
def hashes(monkeypatch):
    """How many times the password hasher ran."""
    calls = []
    real = hashers.check_password

    def counting(password, encoded, *args, **kwargs):
        calls.append(1)
        return real(password, encoded, *args, **kwargs)

    monkeypatch.setattr(hashers, "check_password", counting)
    monkeypatch.setattr("django.contrib.auth.base_user.check_password", counting)
    return calls


def basic(username: str, password: str, ip: str = "198.51.100.150"):
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return Client().get("/api/v1/tiers/", HTTP_AUTHORIZATION=f"Basic {token}", REMOTE_ADDR=ip)


def test_a_verified_password_is_not_hashed_again(operator, hashes):
    assert [basic("ops", "right-password").status_code for _ in range(5)] == [200] * 5
    assert len(hashes) == 1


def test_a_wrong_password_always_runs_the_full_check(operator, hashes):
    assert basic("ops", "right-password").status_code == 200
    assert basic("ops", "wrong").status_code in (401, 403)
    assert basic("ops", "wrong").status_code in (401, 403)
    assert len(hashes) == 3


def test_a_changed_password_forgets_the_old_one(operator):
    assert basic("ops", "right-password").status_code == 200
    operator.set_password("new-password")
    operator.save()
    assert basic("ops", "right-password").status_code in (401, 403)
    assert basic("ops", "new-password").status_code == 200


def test_a_deactivated_user_is_refused_at_once(operator):
    assert basic("ops", "right-password").status_code == 200
    operator.is_active = False
    operator.save(update_fields=["is_active"])
    assert basic("ops", "right-password").status_code in (401, 403)


def test_password_sign_in_turned_off_refuses_a_remembered_password(operator, settings):
    assert basic("ops", "right-password").status_code == 200
    settings.TESSERA_ADMIN_PASSWORD_LOGIN = False
    assert basic("ops", "right-password").status_code in (401, 403)


def test_a_locked_username_is_refused_with_the_lockout(operator, settings):
    settings.TESSERA_LOGIN_FAILURE_LIMIT = 5
    assert basic("ops", "right-password").status_code == 200
    for i in range(5):  # guessed from elsewhere: the username's own lockout
        basic("ops", f"guess-{i}", ip=f"203.0.113.{i + 1}")
    response = basic("ops", "right-password")
    assert response.status_code == 429 and response.json()["code"] == "login_locked_out"
    assert int(response["Retry-After"]) > 0


def test_the_memory_is_bounded(operator, monkeypatch):
    monkeypatch.setattr(basic_cache, "MAX_ENTRIES", 8)
    for i in range(50):
        basic_cache.remember(f"user-{i}", "pw", user_pk=i, stored_hash="x")
    assert len(basic_cache._memory) <= 8
    assert basic_cache.recall("user-49", "pw") is not None


@pytest.mark.parametrize("odd", ["a\x00b", "\x00", "x" * 400])
def test_odd_usernames_get_a_4xx_and_the_remembered_operator_goes_on(operator, odd):
    """A NUL byte (PostgreSQL refuses it: DRF's 400) or an over-long name, six times from the operator's
    address: each a 4xx, never a 500, and the operator signed in there is still answered."""
    assert basic("ops", "right-password").status_code == 200
    for _ in range(6):
        response = basic(odd, "x")
        assert response.status_code in (400, 401, 403, 429), response.content
    assert basic("ops", "right-password").status_code == 200
