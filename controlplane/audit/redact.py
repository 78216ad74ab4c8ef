"""What never reaches the audit log: secrets by field name, and secret-looking values anywhere.

Names alone are not enough (a JSON field, a note or a source URL may hold a key someone pasted),
so string values are scrubbed too. `tokens_per_minute` is a limit, not a secret: names are
matched whole or by suffix, never by substring.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
SECRET_NAMES = frozenset({"password", "key_hash", "secret", "token", "api_key", "cache_salt", "otp_secret",
                          "client_secret", "webhook_secret", "private_key", "access_key", "secret_key"})
SECRET_SUFFIXES = ("_hash", "_secret", "_password", "_salt", "_token", "_private_key")
# Tessera keys, Stripe keys and webhook secrets, bearer tokens, and a URL's user:password part.
_SECRET_VALUE = re.compile(
    r"sk-[A-Za-z0-9_\-]{12,}|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}|whsec_[A-Za-z0-9]{8,}"
    r"|(?i:bearer)\s+[A-Za-z0-9._\-]{8,}"
)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@\s]+@")


def is_secret_name(name: str) -> bool:
    name = name.lower()
    return name in SECRET_NAMES or name.endswith(SECRET_SUFFIXES)


def scrub(value: Any) -> Any:
    """`value` with secret-looking strings replaced, recursively through lists and dicts."""
    if isinstance(value, str):
        value = _SECRET_VALUE.sub(REDACTED, value)
        return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", value)
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(str(k)) else scrub(v) for k, v in value.items()}
    return value


def redact_changes(changes: dict[str, list]) -> dict[str, list]:
    """{field: [before, after]} with secret fields' values hidden (that they changed stays visible)."""
    return {
        field: [None if v is None else REDACTED for v in pair] if is_secret_name(field) else [scrub(v) for v in pair]
        for field, pair in changes.items()
    }
