"""Seed the "Default list price" (billing/default_price.py) when BILLING_DEFAULT_LIST_PRICE is set."""

from django.db import migrations, models


def seed(apps, schema_editor):
    from billing.default_price import default_list_price_seed

    default_list_price_seed(apps.get_model("billing", "Price"))


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0003_usage_batch_price'),
    ]

    operations = [
        migrations.AlterField(
            model_name='price',
            name='model',
            field=models.CharField(help_text='Base model name as served; * : any model not priced by name.', max_length=200),
        ),
        migrations.RunPython(seed, migrations.RunPython.noop),
    ]
