"""No tables of its own: SLIs are computed from billing's request records (selectors.py).

`TierSLO` is a proxy of `tenants.Tier` so the admin can list each tier with its computed SLO status.
"""

from django.db import models  # noqa: F401

from tenants.models import Tier


class TierSLO(Tier):
    class Meta:
        proxy = True
        verbose_name = "SLO status by tier"
        verbose_name_plural = "SLO status by tier"
