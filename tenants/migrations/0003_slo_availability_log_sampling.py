"""Issue 9: the availability SLO on tiers, and the operator's opt-in to log a tenant's content."""

from decimal import Decimal

from django.db import migrations, models

AVAILABILITY = {"free": "99.000", "standard": "99.500", "premium": "99.900", "enterprise": "99.950"}


def seed(apps, schema_editor):
    Tier = apps.get_model("tenants", "Tier")
    for name, pct in AVAILABILITY.items():
        Tier.objects.filter(name=name, slo_availability_pct__isnull=True).update(slo_availability_pct=Decimal(pct))


class Migration(migrations.Migration):
    dependencies = [("tenants", "0002_seed_tiers")]
    operations = [
        migrations.AddField(
            model_name="tier",
            name="slo_availability_pct",
            field=models.DecimalField(
                blank=True, decimal_places=3, max_digits=6, null=True, verbose_name="SLO availability (%)"
            ),
        ),
        migrations.AddField(
            model_name="tenant",
            name="log_content_sample_rate",
            field=models.FloatField(default=0.0),
        ),
        migrations.RunPython(seed, migrations.RunPython.noop),
    ]
