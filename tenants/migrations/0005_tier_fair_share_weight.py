"""Issue 18: a tier's fair-share weight among tenants of one priority (X-Tenant-Weight to workers)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_auth_failure_window"),
    ]

    operations = [
        migrations.AddField(
            model_name="tier",
            name="fair_share_weight",
            field=models.PositiveSmallIntegerField(
                default=1,
                validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)],
            ),
        ),
        migrations.AddConstraint(
            model_name="tier",
            constraint=models.CheckConstraint(
                condition=models.Q(("fair_share_weight__gte", 1), ("fair_share_weight__lte", 1000)),
                name="tier_fair_share_weight_range",
            ),
        ),
    ]
