"""Files (`/v1/files`) and batches (`/v1/batches`), per tenant, in OpenAI's shapes.

A file's bytes live in the files storage (storage.py); the row holds what the API shows. A batch
copies its input file's lines into `BatchLine` rows when it is validated, so deleting the input
file afterwards changes nothing, and each line's state is one row: unique on (batch, custom_id),
which is what makes a line answered and billed once however often its runner restarts.
"""

from __future__ import annotations

from django.db import models

from .fields import JSONTextField


class StoredFile(models.Model):
    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(max_length=40, primary_key=True)  # "file-" + 24 hex, as OpenAI's
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    purpose = models.CharField(max_length=32, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    lines = models.PositiveIntegerField(default=0)
    storage_name = models.CharField(max_length=500)  # the name in the files storage
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"], name="batches_file_tenant_time")]

    def __str__(self) -> str:
        return self.id


class Batch(models.Model):
    class Status(models.TextChoices):
        VALIDATING = "validating"
        FAILED = "failed"
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    id = models.CharField(max_length=40, primary_key=True)  # "batch_" + 24 hex
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    # The key that created it: its lines run as that key (limits, allowed models), like a request would.
    api_key = models.ForeignKey("tenants.APIKey", on_delete=models.SET_NULL, null=True, related_name="+")
    endpoint = models.CharField(max_length=64)
    input_file_id = models.CharField(max_length=40)
    completion_window = models.CharField(max_length=8, default="24h")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    metadata = models.JSONField(null=True, blank=True)
    errors = models.JSONField(null=True, blank=True)  # validation errors, OpenAI's {"object": "list", "data": [...]}
    output_file_id = models.CharField(max_length=40, blank=True, default="")
    error_file_id = models.CharField(max_length=40, blank=True, default="")
    request_total = models.PositiveIntegerField(default=0)
    request_completed = models.PositiveIntegerField(default=0)
    request_failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # The runner holding the batch renews this; another runner takes over only once it has passed
    # (a killed Celery worker's batch is picked up again, a live one's is never run twice at once).
    lease_until = models.DateTimeField(null=True, blank=True)
    # The bytes of its answers stored so far, as the runner holding it last published them (with its
    # lease, every second): the tenant's other batches' runners count them against the storage cap
    # (quota.py). The lines' own `output_bytes` are the exact figure.
    output_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="batches_batch_tenant_time"),
            models.Index(fields=["status"], name="batches_batch_status"),
        ]

    def __str__(self) -> str:
        return self.id


class BatchLine(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"  # sent (or about to be) under `request_id`
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    line_no = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    request_id = models.CharField(max_length=64, blank=True, default="")  # the attempt now (or last) sent
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    # JSON as text, not jsonb: a model's answer may hold a NUL, which jsonb refuses (fields.py).
    response = JSONTextField(null=True, blank=True)  # the answer's body (an error body for a failure)
    error = JSONTextField(null=True, blank=True)  # {"code", "message"} for a line that failed
    not_before = models.DateTimeField(null=True, blank=True)  # a retried line waits until then
    # The bytes its record takes in the output file, set by the UPDATE that stores its answer (0 until
    # it succeeds): what the runner counts against the tenant's storage cap (quota.py).
    output_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "custom_id"], name="batches_line_custom_id_unique")]
        indexes = [models.Index(fields=["batch", "state", "line_no"], name="batches_line_state")]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.custom_id}"
