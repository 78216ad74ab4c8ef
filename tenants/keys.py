"""API key secrets: generation and the keyed hash that is their only stored form."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings

KEY_PREFIX = "sk-"
VISIBLE_CHARS = 11  # "sk-" + 8 characters of the random part


def generate_secret() -> str:
    """A new key: `sk-` + 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """HMAC-SHA256 keyed with the server secret: a leaked table cannot be brute-forced offline."""
    key = settings.TESSERA_API_KEY_SECRET.encode()
    return hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()


def visible_prefix(secret: str) -> str:
    return secret[:VISIBLE_CHARS]


def looks_like_key(secret: str) -> bool:
    return secret.startswith(KEY_PREFIX) and 20 <= len(secret) <= 200
