"""Sign-in writes: find or create the person behind (issuer, sub), and make their roles the provider's."""

from __future__ import annotations

import hashlib
import logging
import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.sso.models import OIDCIdentity
from tenants.roles import ROLES, role_grant

log = logging.getLogger("tessera.sso")

_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")


class SignInRefused(Exception):
    """The provider vouched for the person, but this platform does not let them in (message says why)."""


def claim_roles(claims: dict) -> set[str]:
    """The platform roles that the role claim maps to (TESSERA_OIDC_ROLE_CLAIM, TESSERA_OIDC_ROLE_MAP).

    The claim is a dotted path (Keycloak puts realm roles under `realm_access.roles`); its value may be
    a list or one string. Group names the map does not know are ignored.
    """
    value = claims
    for part in (settings.TESSERA_OIDC_ROLE_CLAIM or "groups").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return set()
    role_map = settings.TESSERA_OIDC_ROLE_MAP or {}
    return {role_map[name] for name in value if isinstance(name, str) and role_map.get(name) in ROLES}


def sso_sign_in(*, issuer: str, claims: dict):
    """The user for a verified sign-in, created on first sight, with exactly the roles the claims map to.

    A known identity whose roles all went away at the provider loses them here too (and staff status)
    before being refused, so a session it may still hold elsewhere cannot reach the admin.
    """
    subject = claims["sub"]
    roles = claim_roles(claims)
    identity = OIDCIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    if identity is None and not roles:
        raise SignInRefused("Your identity provider account holds no role on this platform "
                            f"({' or '.join(ROLES)}). Ask an administrator to add you to a mapped group.")
    if identity is None:
        identity = _identity_create(issuer=issuer, subject=subject, claims=claims)
    user = identity.user
    with transaction.atomic():
        user_roles_sync(user=user, roles=roles)
        _profile_update(user, claims)
        identity.last_login_at = timezone.now()
        identity.last_roles = sorted(roles)
        identity.save(update_fields=["last_login_at", "last_roles"])
    log.info("sso sign-in", extra={"user_id": user.pk, "issuer": issuer, "roles": sorted(roles)})
    if not user.is_active:
        raise SignInRefused("This account is deactivated on this platform.")
    if not roles:
        raise SignInRefused("Your identity provider account no longer holds a role on this platform "
                            f"({' or '.join(ROLES)}). Ask an administrator to add you to a mapped group.")
    return get_user_model().objects.get(pk=user.pk)  # no permission cache from before the sync


def user_roles_sync(*, user, roles: set[str]) -> None:
    """Grant the roles in `roles`, revoke the others; staff exactly when some role is held."""
    with transaction.atomic():
        for role in ROLES:
            role_grant(user=user, role=role, revoke=role not in roles)
        if user.is_staff != bool(roles):
            user.is_staff = bool(roles)
            user.save(update_fields=["is_staff"])


def _identity_create(*, issuer: str, subject: str, claims: dict) -> OIDCIdentity:
    User = get_user_model()
    for _ in range(3):
        try:
            with transaction.atomic():
                user = User.objects.create_user(_free_username(claims, issuer, subject))  # no usable password
                return OIDCIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        except IntegrityError:
            # Two first sign-ins at once: of this person (the other made the identity: use it), or of
            # two people wanting one username (the next try sees it taken and takes the suffixed one).
            found = OIDCIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
            if found is not None:
                return found
    raise SignInRefused("Your account could not be created; try again.")


def _free_username(claims: dict, issuer: str, subject: str) -> str:
    """A readable username; never an existing one (a provider's `admin` must not become the local admin)."""
    User = get_user_model()
    wanted = claims.get("preferred_username") or claims.get("email") or "sso-user"
    base = _USERNAME_UNSAFE.sub("-", str(wanted))[:120] or "sso-user"
    if not User.objects.filter(username__iexact=base).exists():
        return base
    return f"{base}-{hashlib.sha256(f'{issuer} {subject}'.encode()).hexdigest()[:10]}"


def _profile_update(user, claims: dict) -> None:
    fields = {
        "first_name": str(claims.get("given_name") or "")[:150],
        "last_name": str(claims.get("family_name") or "")[:150],
        # Only an address the provider verified is copied: it is shown to operators as the person's.
        "email": str(claims.get("email") or "")[:254] if claims.get("email_verified") is True else "",
    }
    changed = [name for name, value in fields.items() if getattr(user, name) != value]
    for name in changed:
        setattr(user, name, fields[name])
    if changed:
        user.save(update_fields=changed)
