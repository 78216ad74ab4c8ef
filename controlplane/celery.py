"""The Celery app (minimal; created by billing, the first app with tasks).

Configured from Django settings (CELERY_* names); tasks are discovered in each app's tasks.py.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.base")

app = Celery("tessera")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
