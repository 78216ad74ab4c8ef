"""The doors' settings, read at call time so tests (and operators' overrides) take effect at once.

| name | default | meaning |
|---|---|---|
| TESSERA_LOGIN_FAILURE_LIMIT | 5 | failed sign-ins per username, and per client address, before a lockout |
| TESSERA_LOGIN_COOLOFF_SECONDS | 300 | the first lockout's length; each further failure doubles it |
| TESSERA_LOGIN_COOLOFF_MAX_SECONDS | 86400 | the longest lockout; failures are forgotten this long after the last one |
| TESSERA_ADMIN_2FA_ROLES | empty (production: operator,finance) | roles whose holders must pass a TOTP code |
| TESSERA_ADMIN_2FA_SELF_ENROL | 1 | 1: a user who must have 2FA and has none enrols at sign-in; 0: an operator runs otp_enrol |
| TESSERA_TRUSTED_PROXY_HOPS | 0 | proxies appending to X-Forwarded-For (common/client_ip.py) |
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings


def failure_limit() -> int:
    return max(int(getattr(settings, "TESSERA_LOGIN_FAILURE_LIMIT", 5)), 1)


def cooloff_base() -> timedelta:
    return timedelta(seconds=max(float(getattr(settings, "TESSERA_LOGIN_COOLOFF_SECONDS", 300)), 1.0))


def cooloff_max() -> timedelta:
    return max(timedelta(seconds=float(getattr(settings, "TESSERA_LOGIN_COOLOFF_MAX_SECONDS", 86400))), cooloff_base())


def two_factor_roles() -> tuple[str, ...]:
    value = getattr(settings, "TESSERA_ADMIN_2FA_ROLES", ())
    if isinstance(value, str):
        value = value.split(",")
    return tuple(role.strip() for role in value if role and role.strip())


def self_enrol() -> bool:
    return bool(getattr(settings, "TESSERA_ADMIN_2FA_SELF_ENROL", True))
