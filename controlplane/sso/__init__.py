"""Single sign-on for the Django admin: OpenID Connect (authorization code + PKCE, RS256 ID tokens).

People are matched by the provider's (issuer, `sub`) pair kept in `OIDCIdentity`, never by email;
their roles (tenants/roles.py) are re-read from a claim at every sign-in. docs/controlplane.md,
"Single sign-on", says how an operator configures it.
"""
