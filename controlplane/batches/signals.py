"""What batch services announce once committed, so the Celery layer above them runs the batch
without the services importing the tasks (which import the runner, which imports the services)."""

from django.dispatch import Signal

# Sent on commit when a batch needs its runner (created, or cancelling). kwargs: batch_id (str).
batch_run_wanted = Signal()
