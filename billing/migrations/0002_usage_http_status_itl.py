"""Issue 9: the status the client got and the stream's mean inter-token latency, for the SLOs."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]
    operations = [
        migrations.AddField(
            model_name="usagerecord", name="http_status", field=models.PositiveSmallIntegerField(blank=True, null=True)
        ),
        migrations.AddField(model_name="usagerecord", name="itl_ms", field=models.FloatField(blank=True, null=True)),
    ]
