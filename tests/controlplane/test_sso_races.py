"""First sign-ins that race: one person in two tabs, two people wanting one username."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

ISSUER = "https://id.example.com"
ROLE_MAP = {"platform-ops": "operator"}


def _race(claims_list: list[dict]) -> list:
    from django.db import connection

    from controlplane.sso.services import sso_sign_in

    barrier = threading.Barrier(len(claims_list))
    results: list = [None] * len(claims_list)

    def run(index: int, claims: dict) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = sso_sign_in(issuer=ISSUER, claims=claims)
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(claims_list)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.mark.parametrize("attempt", range(3))
def test_one_person_signing_in_twice_at_once_gets_one_account(settings, attempt):
    from controlplane.sso.models import OIDCIdentity

    settings.TESSERA_OIDC_ROLE_MAP = ROLE_MAP
    claims = {"sub": f"tabs-{attempt}", "preferred_username": f"tabs{attempt}", "groups": ["platform-ops"]}
    first, second = _race([claims, dict(claims)])
    assert not isinstance(first, Exception) and not isinstance(second, Exception), (first, second)
    assert first.pk == second.pk
    assert OIDCIdentity.objects.filter(subject=f"tabs-{attempt}").count() == 1


@pytest.mark.parametrize("attempt", range(3))
def test_two_people_wanting_one_username_at_once_both_get_in(settings, attempt):
    settings.TESSERA_OIDC_ROLE_MAP = ROLE_MAP
    name = f"sam{attempt}"
    first, second = _race([{"sub": f"a-{attempt}", "preferred_username": name, "groups": ["platform-ops"]},
                           {"sub": f"b-{attempt}", "preferred_username": name, "groups": ["platform-ops"]}])
    assert not isinstance(first, Exception) and not isinstance(second, Exception), (first, second)
    assert first.pk != second.pk
    assert sorted([first.username == name, second.username == name]) == [False, True]
