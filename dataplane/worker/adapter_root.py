"""The worker's own adapter store check (`--adapter-root`): defence in depth behind the control plane's.

The control plane accepts a tenant's adapter source only inside `<store>/<tenant slug>/`; the
worker checks again against its own root, after resolving `..` and symlinks, so a source that
slipped past the control plane (an old row, a bug, a forged task) still cannot read anything
else on the worker. With no root configured a worker loads no adapters from local paths.
"""

from __future__ import annotations

import os
from pathlib import Path


class OutsideAdapterRoot(ValueError):
    """The path resolves outside the adapter root (or the tenant's folder of it), or no root is set."""


def resolve_in_root(path: str | os.PathLike, root: str | os.PathLike | None, tenant: str | None = None) -> Path:
    """`path` with `..` and symlinks resolved, if it lies strictly inside `root[/tenant]`; else OutsideAdapterRoot.

    Relative paths are taken relative to `root[/tenant]`. Nothing needs to exist for the check
    (a missing adapter then fails to load with its own error).
    """
    if not root:
        raise OutsideAdapterRoot("this worker has no adapter root (--adapter-root): it loads no local adapters")
    if tenant is not None and (not tenant or "/" in tenant or tenant in (".", "..")):
        raise OutsideAdapterRoot(f"tenant {tenant!r} cannot name a folder of the adapter root")
    top = base = Path(os.path.realpath(root))
    if tenant:
        base = Path(os.path.realpath(top / tenant))
        if base == top or not base.is_relative_to(top):
            raise OutsideAdapterRoot(f"the tenant folder {top / tenant} resolves outside the adapter root {top}")
    resolved = Path(os.path.realpath(base / os.fspath(path)))
    if resolved == base or not resolved.is_relative_to(base):
        raise OutsideAdapterRoot(f"{os.fspath(path)!r} resolves to {resolved}, outside the adapter root {base}")
    return resolved
