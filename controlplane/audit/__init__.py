"""Append-only audit log: who changed what that matters for access or money, when and from where.

Services call `audit.record(...)` or wrap an update in `with audit.change(...)`; the actor and
origin come from a context variable set by the middleware, the commands and the Celery tasks.
"""

from __future__ import annotations

# Django imports this package while it loads the installed apps, before any model can be imported; the
# writer imports the audit models, so it is imported at the first call, not here.


def record(*args, **kwargs):
    from .writer import record as _record  # lazy: models (see above)

    return _record(*args, **kwargs)


def change(*args, **kwargs):
    from .writer import change as _change  # lazy: models (see above)

    return _change(*args, **kwargs)
