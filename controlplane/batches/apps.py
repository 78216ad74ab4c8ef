from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "controlplane.batches"
    label = "batches"
    verbose_name = "Files and batches"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from . import tasks  # noqa: F401 - connects the receiver that enqueues a batch's runner
        from .models import StoredFile
        from .storage import forget_bytes

        # Also on a tenant's deletion (its files go by cascade): the bytes go once the rows have.
        post_delete.connect(forget_bytes, sender=StoredFile, dispatch_uid="batches-file-bytes")
