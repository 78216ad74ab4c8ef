"""Two-factor for staff: who must pass a TOTP code, checking one, and enrolling a device.

Who: a user holding a role named in TESSERA_ADMIN_2FA_ROLES (superusers hold every role, so they
are included whenever the list is not empty), and any user who has a confirmed device (having
enrolled, the code is always asked). Verified: django-otp's `request.user.is_verified()` (the
session holds the device that passed), or an identity provider that did the second factor itself
(`mark_verified_by_idp`, the single sign-on hook).

Codes: a 6-digit code is checked against the user's TOTP devices (each code once: django-otp
keeps the last time step used), anything else against their recovery codes (django-otp static
tokens, each deleted as it is used). Wrong codes are throttled per device by django-otp (the
delay doubles per failure) and also count as failed sign-ins for the lockout (lockout.py).
"""

from __future__ import annotations

import re

from django.db import transaction
from django_otp import user_has_device
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants.roles import user_has_role

from . import conf

# The session key of the single sign-on hook: the user's pk when their identity provider did MFA.
IDP_VERIFIED_SESSION_KEY = "tessera_second_factor_by_idp"
TOTP_NAME = "authenticator"
RECOVERY_NAME = "recovery codes"
RECOVERY_CODES = 10
_TOTP_SHAPE = re.compile(r"^\d{6}$")
_RECOVERY_SHAPE = re.compile(r"^[a-z2-7]{8}$")


def requires_second_factor(user) -> bool:
    if not (user is not None and getattr(user, "is_authenticated", False) and user.is_active):
        return False
    if user_has_device(user, confirmed=True):
        return True
    return any(user_has_role(user, role) for role in conf.two_factor_roles())


def mark_verified_by_idp(request) -> None:
    """For single sign-on: call after `login()` when the identity provider did the second factor."""
    request.session[IDP_VERIFIED_SESSION_KEY] = request.user.pk


def is_verified(request) -> bool:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return False
    check = getattr(user, "is_verified", None)
    if check is not None and check():
        return True
    return request.session.get(IDP_VERIFIED_SESSION_KEY) == user.pk


def second_factor_ok(request) -> bool:
    """True when this request's user needs no second factor or has passed one in this session."""
    return is_verified(request) or not requires_second_factor(getattr(request, "user", None))


def normalize_code(raw: str) -> str:
    return re.sub(r"[\s-]", "", str(raw or "")).lower()[:32]


def verify_code(user, raw: str):
    """(the device that accepted `raw` and consumed it, or None; whether a device refused to check it
    because of earlier failures). The row lock makes two concurrent uses of one code succeed once."""
    code = normalize_code(raw)
    if _TOTP_SHAPE.match(code):
        model = TOTPDevice
    elif _RECOVERY_SHAPE.match(code):
        model = StaticDevice
    else:
        return None, False
    throttled = False
    with transaction.atomic():
        for device in model.objects.devices_for_user(user, confirmed=True).select_for_update():
            if not device.verify_is_allowed()[0]:
                throttled = True
            elif device.verify_token(code):
                return device, False
    return None, throttled


@transaction.atomic
def enrolment_start(user) -> TOTPDevice:
    """A fresh unconfirmed TOTP device for an enrolment page, replacing any earlier one: a key shown to
    one session (someone else's, holding the password) is never the key another session confirms."""
    TOTPDevice.objects.filter(user=user, confirmed=False).delete()
    return TOTPDevice.objects.create(user=user, name=TOTP_NAME, confirmed=False)


@transaction.atomic
def recovery_codes_issue(user) -> list[str]:
    """Replace the user's recovery codes with RECOVERY_CODES fresh ones; returns them (shown once)."""
    StaticDevice.objects.filter(user=user).delete()
    device = StaticDevice.objects.create(user=user, name=RECOVERY_NAME, confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create([StaticToken(device=device, token=code) for code in codes])
    return codes


@transaction.atomic
def enrolment_confirm(device: TOTPDevice, raw: str) -> list[str] | None:
    """Confirm a pending TOTP device with its first code; returns the new recovery codes, or None if wrong."""
    device = TOTPDevice.objects.select_for_update().get(pk=device.pk)
    code = normalize_code(raw)
    if device.confirmed or not _TOTP_SHAPE.match(code) or not device.verify_is_allowed()[0]:
        return None
    if not device.verify_token(code):
        return None
    TOTPDevice.objects.filter(user=device.user).exclude(pk=device.pk).delete()  # one authenticator per user
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    return recovery_codes_issue(device.user)


@transaction.atomic
def devices_reset(user) -> int:
    """Remove every device of the user (a lost phone); their next sign-in enrols again."""
    count = 0
    for model in (TOTPDevice, StaticDevice):
        deleted, _ = model.objects.filter(user=user).delete()
        count += deleted
    return count


def otp_enrol(user) -> tuple[TOTPDevice, list[str]]:
    """Operator enrolment (CLI): a new confirmed TOTP device and recovery codes, replacing any before."""
    with transaction.atomic():
        devices_reset(user)
        device = TOTPDevice.objects.create(user=user, name=TOTP_NAME, confirmed=True)
        codes = recovery_codes_issue(user)
    return device, codes
