"""Issue 22: failed API-key authentications counted per client address (database limiter)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenants", "0003_slo_availability_log_sampling")]
    operations = [
        migrations.CreateModel(
            name="AuthFailureWindow",
            fields=[
                ("address", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("allowance", models.FloatField(default=0)),
                ("refilled_at", models.FloatField(db_index=True, default=0)),
            ],
            options={"verbose_name": "failed-authentication window"},
        ),
    ]
