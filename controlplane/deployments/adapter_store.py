"""Where a tenant's adapters may come from: its own folder of the operator-configured adapter store.

A source is accepted only inside the tenant's own part of the store, after normalisation:

- a local path (on the workers, which mount the store at the same place): under
  `TESSERA_ADAPTER_ROOT/<tenant slug>/`, after `..` and symlinks are resolved (`os.path.realpath`);
  a relative source is taken relative to that folder;
- an object-store URI: under one of the prefixes in `TESSERA_ADAPTER_SOURCES` (comma-separated,
  e.g. `s3://tessera-adapters,gs://lora/store`), as `<prefix>/<tenant slug>/...`, with no `..`,
  `.`, empty segments, query or fragment.

Nothing is checked for existence here: the refusal is the same whether or not the path exists, so
the API cannot be used to probe the store (or the control plane's file system). Workers check the
same store again (`--adapter-root`), and report what they could not load in words operators see
(the placement's reason, logs) and tenants do not (`PUBLIC_REASONS`).
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlparse

from common.errors import ApplicationError

from . import conf

# What a tenant is told when its adapter cannot be loaded, by the worker's error kind. The worker's
# own words (paths, exceptions) stay in AdapterPlacement.reason / Adapter.reason_detail for operators.
PUBLIC_REASONS = {
    "not_found": "the adapter could not be loaded: not found in your adapter store",
    "invalid": "the adapter could not be loaded: invalid PEFT files",
    "too_large": "the adapter could not be loaded: its rank or targets do not fit this deployment",
    "error": "the adapter could not be loaded on a replica of its base model (retried; operators were told)",
}
ERROR_KINDS = tuple(PUBLIC_REASONS)


def public_reason(kind: str | None) -> str:
    return PUBLIC_REASONS.get(kind or "error", PUBLIC_REASONS["error"])


def _refused(slug: str) -> ApplicationError:
    # The same words for a path outside the store, an escape and a missing file: nothing is probed.
    return ApplicationError(
        f"source: must name an adapter inside your adapter store ('{slug}/...' under the store the operator "
        "configured: a path relative to it, or one of its allowed URIs).", code="invalid_adapter_source",
        param="source")


def adapter_source_normalize(*, tenant, source: str) -> str:
    """The canonical form of `source` if it lies inside `tenant`'s store, else ApplicationError (400)."""
    source = (source or "").strip()
    if not source:
        raise ApplicationError("source: required (a folder of your adapter store, e.g. 'support-v2').",
                               code="invalid_value", param="source")
    if "\x00" in source or len(source) > 500:
        raise _refused(tenant.slug)
    parsed = urlparse(source)
    if parsed.scheme and len(parsed.scheme) > 1 and parsed.scheme != "file":
        return _normalize_uri(tenant.slug, source)
    path = parsed.path if parsed.scheme == "file" else source
    return _normalize_path(tenant.slug, path)


def _normalize_path(slug: str, path: str) -> str:
    root = conf.get_str("TESSERA_ADAPTER_ROOT")
    if not root:
        raise _refused(slug)
    tenant_root = os.path.realpath(os.path.join(os.path.realpath(root), slug))
    candidate = os.path.realpath(os.path.join(tenant_root, os.path.expanduser(path) if path.startswith("~") else path))
    if candidate == tenant_root or os.path.commonpath([tenant_root, candidate]) != tenant_root:
        raise _refused(slug)
    return candidate


def _normalize_uri(slug: str, source: str) -> str:
    parsed = urlparse(source)
    segments = parsed.path.split("/")[1:]
    if parsed.query or parsed.fragment or parsed.params or "%" in source or "\\" in source \
            or not parsed.netloc or any(s in ("", ".", "..") for s in segments):
        raise _refused(slug)
    for prefix in _uri_prefixes():
        allowed = urlparse(prefix)
        base = [s for s in allowed.path.split("/") if s]
        if (parsed.scheme, parsed.netloc) == (allowed.scheme, allowed.netloc) \
                and segments[:len(base) + 1] == [*base, slug] and len(segments) > len(base) + 1:
            return f"{parsed.scheme}://{parsed.netloc}{posixpath.normpath(parsed.path)}"
    raise _refused(slug)


def _uri_prefixes() -> list[str]:
    raw = conf.get_str("TESSERA_ADAPTER_SOURCES")
    return [p.strip().rstrip("/") for p in raw.split(",") if "://" in p]


def adapter_limit() -> int:
    return int(conf.get("TESSERA_MAX_ADAPTERS_PER_TENANT"))
