"""Production: secrets must come from the environment; secure cookies; JSON logs (from base)."""

import os

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F401,F403
from .base import TESSERA_OIDC_CLIENT_ID, TESSERA_OIDC_CLIENT_SECRET, TESSERA_OIDC_ISSUER

DEBUG = False

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY or SECRET_KEY == "dev-insecure-change-me":
    raise ImproperlyConfigured("Set DJANGO_SECRET_KEY for production.")
TESSERA_API_KEY_SECRET = os.environ.get("TESSERA_API_KEY_SECRET", SECRET_KEY)

SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "31536000"))
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# Staff holding these roles (superusers too: they hold every role) pass a TOTP code at admin sign-in
# (controlplane/doors). An empty value keeps this list: production does not run without a second factor
# (single sign-on sessions count as verified when the identity provider did MFA).
TESSERA_ADMIN_2FA_ROLES = [r.strip() for r in (os.environ.get("TESSERA_ADMIN_2FA_ROLES") or "operator,finance").split(",")
                           if r.strip()]

# Single sign-on (docs/controlplane.md, "Single sign-on"). With an issuer set, local passwords are off
# unless TESSERA_ADMIN_PASSWORD_LOGIN=true says otherwise (the break-glass switch if the provider is
# lost); without one they stay on, or nobody could sign in.
if TESSERA_OIDC_ISSUER:
    if not TESSERA_OIDC_ISSUER.startswith("https://"):
        raise ImproperlyConfigured("TESSERA_OIDC_ISSUER must be an https:// URL in production.")
    if not (TESSERA_OIDC_CLIENT_ID and TESSERA_OIDC_CLIENT_SECRET):
        raise ImproperlyConfigured("Set TESSERA_OIDC_CLIENT_ID and TESSERA_OIDC_CLIENT_SECRET with TESSERA_OIDC_ISSUER.")
# (Empty counts as unset: compose passes every variable, set or not.)
TESSERA_ADMIN_PASSWORD_LOGIN = (os.environ.get("TESSERA_ADMIN_PASSWORD_LOGIN")
                                or ("false" if TESSERA_OIDC_ISSUER else "true")).lower() not in ("0", "false", "no", "off")
