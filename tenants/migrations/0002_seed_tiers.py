"""Seed the four tiers. Operators tune them in the admin; re-running never overwrites edits."""

from decimal import Decimal

from django.db import migrations

TIERS = [
    # name, priority, rpm, tpm, concurrent, monthly tokens, monthly spend, enforcement, ttft p95, itl p95
    ("free", 30, 20, 20_000, 2, 2_000_000, None, "hard", 5000, 250),
    ("standard", 20, 300, 200_000, 16, None, Decimal("500.00"), "hard", 2000, 120),
    ("premium", 10, 1_500, 1_000_000, 64, None, Decimal("5000.00"), "soft", 1000, 80),
    ("enterprise", 0, 10_000, 10_000_000, 256, None, None, "soft", 500, 50),
]


def seed(apps, schema_editor):
    Tier = apps.get_model("tenants", "Tier")
    for name, priority, rpm, tpm, conc, tokens, spend, enforcement, ttft, itl in TIERS:
        Tier.objects.get_or_create(
            name=name,
            defaults=dict(
                priority=priority,
                requests_per_minute=rpm,
                tokens_per_minute=tpm,
                max_concurrent_requests=conc,
                monthly_token_budget=tokens,
                monthly_spend_budget=spend,
                budget_enforcement=enforcement,
                slo_ttft_p95_ms=ttft,
                slo_itl_p95_ms=itl,
            ),
        )


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
