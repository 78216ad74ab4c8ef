"""The client's address, for anything that counts or refuses per address (admin lockout, bad-key throttling).

Behind N reverse proxies that each append to X-Forwarded-For, the client is the N-th entry from the
right: everything left of it was written by the client itself and proves nothing. With no trusted
proxy (TESSERA_TRUSTED_PROXY_HOPS=0, the default) the header is ignored and the socket's peer is the
client, so a direct caller cannot pick the address it is counted under.

One function serves a Django HttpRequest and a raw ASGI scope's headers (the /v1 gateway runs
below Django's middleware), so both doors count the same client under the same key.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

HEADER = "x-forwarded-for"
META_KEY = "HTTP_X_FORWARDED_FOR"


def trusted_proxy_hops() -> int:
    """TESSERA_TRUSTED_PROXY_HOPS from Django settings when configured, else the environment; never negative."""
    value: Any = None
    if settings.configured:
        value = getattr(settings, "TESSERA_TRUSTED_PROXY_HOPS", None)
    if value is None:
        value = os.environ.get("TESSERA_TRUSTED_PROXY_HOPS", "0")
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


@functools.lru_cache(maxsize=4096)  # ipaddress is slow and a client sends many requests from one address
def normalize(address: str | None) -> str | None:
    """The canonical text of an IP address (IPv4-mapped IPv6 as IPv4, ports and brackets dropped); None if not one."""
    if not address:
        return None
    text = address.strip()
    if text.startswith("["):  # "[2001:db8::1]:443"
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:  # "192.0.2.1:5678"
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # a zone id ("fe80::1%eth0") is not part of the address
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def _forwarded_for(source: Any) -> str:
    """All X-Forwarded-For values of a request, META mapping or ASGI header list, joined in order."""
    meta = getattr(source, "META", None)
    if meta is not None:
        return str(meta.get(META_KEY, ""))
    if isinstance(source, Mapping):
        if META_KEY in source:
            return str(source[META_KEY])
        for name, value in source.items():
            if str(name).lower() == HEADER:
                return value.decode("latin-1") if isinstance(value, bytes) else str(value)
        return ""
    values = []
    for name, value in source or ():
        name_text = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        if name_text.lower() == HEADER:
            values.append(value.decode("latin-1") if isinstance(value, bytes) else str(value))
    return ",".join(values)  # repeated fields combine in order (RFC 9110 5.3)


def client_ip(
    request_or_headers: Any,
    remote_addr: str | None = None,
    *,
    trusted_hops: int | None = None,
) -> str:
    """The address of the client that sent a request, as canonical text ("" when nothing usable is known).

    request_or_headers: a Django HttpRequest (its META gives REMOTE_ADDR and X-Forwarded-For), a
        META-like mapping, or an ASGI scope's raw `headers` (an iterable of (bytes, bytes) pairs).
    remote_addr: the socket peer; for ASGI pass `scope["client"][0]`. Defaults to META["REMOTE_ADDR"].
    trusted_hops: how many proxies in front of this process append to X-Forwarded-For; defaults to
        TESSERA_TRUSTED_PROXY_HOPS. 0 ignores the header entirely.

    With hops N and a header holding fewer than N addresses, or an unparseable one at the chosen
    position, the header is not trusted and the socket peer is returned (a misconfigured or bypassed
    proxy must not hand the choice of address to the client).
    """
    if remote_addr is None:
        meta = getattr(request_or_headers, "META", request_or_headers)
        remote_addr = meta.get("REMOTE_ADDR") if isinstance(meta, Mapping) else None
    peer = normalize(remote_addr) or (remote_addr or "").strip()
    hops = trusted_proxy_hops() if trusted_hops is None else max(int(trusted_hops), 0)
    if hops == 0:
        return peer
    entries = [part.strip() for part in _forwarded_for(request_or_headers).split(",") if part.strip()]
    if len(entries) < hops:
        return peer
    return normalize(entries[-hops]) or peer


def client_ip_from_scope(scope: Mapping[str, Any], *, trusted_hops: int | None = None) -> str:
    """client_ip for an ASGI HTTP scope (its headers and its `client` pair)."""
    client = scope.get("client") or (None, None)
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers") or ()
    return client_ip(headers, client[0] or "", trusted_hops=trusted_hops)
