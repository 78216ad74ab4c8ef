"""Where file bytes live: Django's storage API, so an operator can point it at S3-compatible storage.

`STORAGES["tessera_files"]` when the settings define it (for instance django-storages' S3 backend
with an endpoint URL); otherwise a folder on disk, TESSERA_FILES_DIR (default var/files).
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.core.files.storage.handler import InvalidStorageError
from django.db import transaction

ALIAS = "tessera_files"


def files_storage() -> Storage:
    try:
        return storages[ALIAS]
    except InvalidStorageError:
        folder = getattr(settings, "TESSERA_FILES_DIR", None) or Path(settings.VAR_DIR) / "files"
        return FileSystemStorage(location=str(folder))


def forget_bytes(sender, instance, **kwargs) -> None:
    """A deleted file's bytes, removed once the deletion is committed (a rollback keeps them)."""
    transaction.on_commit(lambda: files_storage().delete(instance.storage_name))
