# The Celery app is loaded with Django so that @shared_task uses it (the standard Django pattern).
from .celery import app as celery_app

__all__ = ("celery_app",)
