"""DRF authentication with a tenant's API key (`Authorization: Bearer sk-...`).

People use Django users (session or basic auth) holding a role (tenants/roles.py); tenants use their keys. A key
authenticates the management API only when it has `can_manage`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions

from common.client_ip import client_ip
from common.errors import ApplicationError
from tenants import auth, auth_throttle
from tenants.auth import KeyPrincipal


@dataclass(frozen=True)
class TenantUser:
    """`request.user` for a key: authenticated, never staff."""

    principal: KeyPrincipal
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    is_anonymous: bool = False

    @property
    def pk(self) -> str:  # throttling and logging identify the caller by this
        return f"key:{self.principal.key_id}"

    def __str__(self) -> str:
        return f"{self.principal.tenant_slug}/{self.principal.key_prefix}"


def _principal(header: str) -> KeyPrincipal:
    return auth.authenticate(auth.bearer_secret(header))


class APIKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header.lower().startswith("bearer "):
            return None  # let session/basic authentication try
        try:
            # Failed keys are throttled per client address (tenants/auth_throttle.py): past the limit the
            # ApplicationError is a 429, rendered in DRF's format by common.errors.
            principal = auth_throttle.guarded_sync(client_ip(request), header, _principal)
        except ApplicationError as exc:
            if exc.status == 429:
                raise
            if exc.status == 401:
                raise exceptions.AuthenticationFailed(exc.message, code=exc.code) from None
            raise exceptions.PermissionDenied(exc.message, code=exc.code) from None
        if not principal.can_manage:
            raise exceptions.PermissionDenied(
                "This API key may not use the management API (it lacks can_manage).", code="key_cannot_manage"
            )
        return TenantUser(principal), principal

    def authenticate_header(self, request) -> str:
        return f'{self.keyword} realm="tessera"'


try:  # describe the key scheme in the OpenAPI schema
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class APIKeyAuthenticationScheme(OpenApiAuthenticationExtension):
        target_class = "tenants.api.authentication.APIKeyAuthentication"
        name = "tenantApiKey"

        def get_security_definition(self, auto_schema):
            return {"type": "http", "scheme": "bearer", "bearerFormat": "sk-... (a tenant key with can_manage)"}

except ImportError:  # pragma: no cover
    pass
