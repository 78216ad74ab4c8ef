"""What should run (Model, Adapter, Deployment) and what does (Worker, Replica, AdapterPlacement).

Operators declare models and deployments; tenants declare their own adapters. Workers register
and heartbeat. The reconciler (reconciler.py) turns the difference into replicas and adapter
placements, and Celery tasks on each worker's own queue (`worker.<name>`) make them real.
"""

from __future__ import annotations

import uuid

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

# Names end up in queue names, URLs and model ids: letters, digits, dot, dash, underscore.
name_validator = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", "Use letters, digits, '.', '-' and '_'.")


class Quantization(models.TextChoices):
    BF16 = "bf16", "bf16 (the checkpoint's own weights)"
    FP8 = "fp8", "fp8 (per-channel e4m3)"
    AWQ_INT4 = "awq-int4", "awq-int4 (AWQ 4-bit groups)"
    GGUF = "gguf", "gguf (a GGUF file's own Q4_1 / Q8_0 blocks; CPU workers)"


# The engine's `quantization` argument for each choice (dataplane.config.ModelConfig).
ENGINE_QUANTIZATION = {Quantization.BF16: None, Quantization.FP8: "fp8", Quantization.AWQ_INT4: "awq",
                       Quantization.GGUF: "gguf"}
# What operators may type (CLI, API) for each choice.
QUANTIZATION_ALIASES = {"none": "bf16", "bf16": "bf16", "fp8": "fp8", "awq": "awq-int4", "awq-int4": "awq-int4",
                        "int4": "awq-int4", "gguf": "gguf"}


def default_quantizations() -> list[str]:
    return [Quantization.BF16.value]


class Model(models.Model):
    name = models.CharField(max_length=128, unique=True, validators=[name_validator],
                            help_text="The id clients send as `model` (unless a deployment serves it under another).")
    source = models.CharField(max_length=500, help_text="A package alias (smollm2-135m-instruct), a path on the "
                              "worker (GGUF file or Hugging Face directory), or an object-store URI (s3://…).")
    architecture = models.CharField(max_length=64, default="llama")
    context_length = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the checkpoint's own.")
    quantizations = models.JSONField(default=default_quantizations, blank=True,
                                     help_text="Available: any of bf16, fp8, awq-int4, gguf.")
    quantized_sources = models.JSONField(default=dict, blank=True, help_text='Prebuilt checkpoints per method, '
                                         'e.g. {"awq-int4": "/models/x-awq"}; absent: quantized at load (fp8 only).')
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def source_kind(self) -> str:
        if "://" in self.source:
            return "uri"
        if self.source.startswith(("/", ".", "~")) or self.source.endswith(".gguf"):
            return "path"
        return "alias"

    def source_for(self, quantization: str) -> str:
        return (self.quantized_sources or {}).get(quantization) or self.source


class AdapterStatus(models.TextChoices):
    PENDING = "pending"  # no placement is ready yet
    READY = "ready"  # served by at least one replica
    FAILED = "failed"  # every placement failed (see reason)
    DELETING = "deleting"  # being unloaded everywhere, then removed


class Adapter(models.Model):
    """A tenant's LoRA adapter on a base model. Only its tenant (and operators) can see or use it."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="adapters")
    name = models.CharField(max_length=64, validators=[name_validator])
    # The id clients send as `model`: "<tenant slug>:<name>", unique platform-wide.
    served_name = models.CharField(max_length=140, unique=True, editable=False)
    base_model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="adapters")
    source = models.CharField(max_length=500, help_text="Inside the tenant's adapter store (adapter_store.py): "
                              "<TESSERA_ADAPTER_ROOT>/<tenant>/..., or an allowed URI prefix /<tenant>/....")
    rank = models.PositiveSmallIntegerField(default=8)
    status = models.CharField(max_length=16, choices=AdapterStatus.choices, default=AdapterStatus.PENDING)
    reason = models.TextField(blank=True, help_text="What the tenant is told (never the worker's paths).")
    reason_detail = models.TextField(blank=True, help_text="Operators only: the worker's own words.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="adapter_name_per_tenant")]

    def __str__(self) -> str:
        return self.served_name


class WorkerStatus(models.TextChoices):
    STARTING = "starting"  # registered; its task consumer is not up yet
    READY = "ready"  # heartbeating and consuming its queue
    DRAINING = "draining"  # shutting down (or cordoned): gets no new replicas, its replicas move away
    DEAD = "dead"  # missed heartbeats; its replicas were rescheduled


class Worker(models.Model):
    name = models.CharField(max_length=128, unique=True, validators=[name_validator],
                            help_text="The worker's id; it consumes the Celery queue worker.<name>.")
    url = models.CharField(max_length=300, help_text="Where the gateway reaches its OpenAI API (http://host:port).")
    accelerator = models.CharField(max_length=128, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True, help_text="Accelerator memory.")
    device_count = models.PositiveSmallIntegerField(default=1, help_text="Devices a replica may span (GPUs; on "
                                                    "a CPU worker the tensor-parallel ranks it offers).")
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.STARTING)
    cordoned = models.BooleanField(default=False, help_text="Drained by an operator: no new replicas; "
                                   "existing ones move once their replacements are ready.")
    boot_id = models.CharField(max_length=64, blank=True, help_text="Changes on every process start.")
    registered_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # As the worker last reported them.
    loaded_model = models.CharField(max_length=140, blank=True)
    loaded_adapters = models.JSONField(default=list, blank=True)
    num_running = models.PositiveIntegerField(default=0)
    num_waiting = models.PositiveIntegerField(default=0)
    kv_cache_usage = models.FloatField(default=0.0)
    stats = models.JSONField(default=dict, blank=True, help_text="The agent's counters (loads, tasks).")

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["status", "last_heartbeat_at"])]
        # The admin's actions on workers, each its own permission: seeing a worker (view) or editing
        # it (change: nothing is editable) must not let anyone drain it, kill it or free its name.
        permissions = [
            ("drain_worker", "Can drain (cordon) and uncordon a worker"),
            ("mark_dead_worker", "Can mark a worker dead and reschedule its replicas"),
            ("release_worker", "Can release a worker's registration"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"worker.{self.name}"

    @property
    def schedulable(self) -> bool:
        return self.status == WorkerStatus.READY and not self.cordoned


class Deployment(models.Model):
    """A model at a quantization, wanted on `desired_replicas` workers matching `placement`."""

    name = models.CharField(max_length=128, unique=True, validators=[name_validator])
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    quantization = models.CharField(max_length=16, choices=Quantization.choices, default=Quantization.BF16)
    desired_replicas = models.PositiveIntegerField(default=1)
    # Autoscaling (autoscale/): on when max_replicas is set; the reconciler then moves desired_replicas
    # within [min_replicas, max_replicas]. min_replicas 0 scales to zero (the first request wakes it).
    min_replicas = models.PositiveIntegerField(default=1, help_text="Autoscaling's floor; 0: scale to zero "
                                               "when idle (the first request is answered 503 + Retry-After "
                                               "while a replica loads).")
    max_replicas = models.PositiveIntegerField(null=True, blank=True, help_text="Autoscaling's ceiling; blank: "
                                               "no autoscaling (desired_replicas as set).")
    served_name = models.CharField(max_length=128, validators=[name_validator], blank=True,
                                   help_text="The id clients send as `model`; defaults to the model's name.")
    placement = models.JSONField(default=dict, blank=True, help_text='Constraints: {"accelerator": "H100", '
                                 '"min_memory_gib": 40, "labels": {"zone": "a"}, "workers": ["gpu-0"]}.')
    engine_args = models.JSONField(default=dict, blank=True, help_text='Engine settings, e.g. {"kv_cache_memory": '
                                   '"8GiB", "max_num_seqs": 128, "dtype": "bfloat16"}.')
    max_adapters = models.PositiveSmallIntegerField(default=0, help_text="LoRA slots per replica; 0: base model only.")
    # Disaggregated serving (docs/kv_cache.md, part 3): this many replicas compute long prompts only; the
    # others (desired_replicas, autoscaled as usual) fetch those prompts' KV blocks from them. The gateway
    # routes clients to the serving replicas alone and names a ready prefill replica with each request.
    prefill_replicas = models.PositiveSmallIntegerField(
        default=0, help_text="Replicas that compute long prompts for the others (disaggregated prefill); 0: none. "
                             "Needs engine_args.kv_offload_size.")
    deleting = models.BooleanField(default=False, help_text="Removed once its replicas have stopped.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        # Unloading and deleting a deployment is the model's own `delete` permission.
        permissions = [
            ("retry_deployment", "Can retry a deployment's failed replicas"),
            ("reconcile_deployment", "Can run the reconciler now"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas is not None

    @property
    def engine_quantization(self) -> str | None:
        return ENGINE_QUANTIZATION[Quantization(self.quantization)]


class ReplicaRole(models.TextChoices):
    SERVE = "serve"  # answers clients (unified, or decode when the deployment has prefill replicas)
    PREFILL = "prefill"  # computes prompts for the serving replicas; never routed to by the gateway


class ReplicaStatus(models.TextChoices):
    PENDING = "pending"  # wanted; waiting for a worker
    LOADING = "loading"  # load_model sent to its worker (attempt N)
    READY = "ready"  # serving
    FAILED = "failed"  # see reason; retried after retry_at unless it is permanent (retry_at empty)
    STOPPING = "stopping"  # unload_model sent; the row goes once the worker confirms (or dies)


ACTIVE_REPLICA_STATUSES = (ReplicaStatus.LOADING, ReplicaStatus.READY, ReplicaStatus.STOPPING)


class Replica(models.Model):
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replicas")
    worker = models.ForeignKey(Worker, on_delete=models.SET_NULL, null=True, blank=True, related_name="replicas")
    status = models.CharField(max_length=16, choices=ReplicaStatus.choices, default=ReplicaStatus.PENDING)
    role = models.CharField(max_length=8, choices=ReplicaRole.choices, default=ReplicaRole.SERVE)
    reason = models.TextField(blank=True)
    # Incremented on every dispatch; messages and reports carry it, so stale ones are recognised.
    attempt = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0, help_text="Consecutive failed attempts.")
    retry_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    redispatches = models.PositiveSmallIntegerField(default=0)
    ready_at = models.DateTimeField(null=True, blank=True)
    load_seconds = models.FloatField(null=True, blank=True)
    gate = models.JSONField(null=True, blank=True, help_text="Quality gate report (quantized replicas).")
    # Set when the autoscaler picked this ready replica for removal: out of the routing table at once,
    # unloaded only once its worker reports it idle (or TESSERA_AUTOSCALE_DRAIN_SECONDS passed).
    drain_started_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment_id", "id"]
        constraints = [
            # One engine per worker process: at most one replica occupies a worker.
            models.UniqueConstraint(fields=["worker"], condition=Q(status__in=ACTIVE_REPLICA_STATUSES),
                                    name="one_active_replica_per_worker"),
        ]
        indexes = [models.Index(fields=["status"])]
        permissions = [("retry_replica", "Can retry a failed replica")]

    def __str__(self) -> str:
        return f"{self.deployment.name}#{self.pk}"


class PlacementStatus(models.TextChoices):
    PENDING = "pending"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


class AdapterPlacement(models.Model):
    """One adapter loaded on one ready replica of its base model."""

    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="placements")
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="adapter_placements")
    status = models.CharField(max_length=16, choices=PlacementStatus.choices, default=PlacementStatus.PENDING)
    reason = models.TextField(blank=True, help_text="Operators only: the worker's own words.")
    # not_found / invalid / too_large / error: picks the tenant's wording (adapter_store.PUBLIC_REASONS).
    error_kind = models.CharField(max_length=16, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    retry_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    redispatches = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["adapter_id", "replica_id"]
        constraints = [models.UniqueConstraint(fields=["adapter", "replica"], name="one_placement_per_replica")]

    def __str__(self) -> str:
        return f"{self.adapter.served_name}@{self.replica_id}"


class ReconcilerState(models.Model):
    """One row (pk 1): the reconciler's own clock, kept in the database it reconciles.

    `resumed_at` is the first pass after a gap longer than the reconciler's usual interval: the
    control plane (its database, its broker, its beat) was away, and workers' heartbeats in that time
    may have been lost. No worker is declared dead on heartbeats older than that (reconciler.py).
    """

    last_pass_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "reconciler state"


class AutoscalerState(models.Model):
    """The autoscaler's memory of one deployment (autoscale/service.py): its clocks, for cooldowns and
    hysteresis, and its last reading, for /metrics (the reconciler runs in a Celery worker; the web
    process that Prometheus scrapes reads this row)."""

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="autoscaler")
    last_up_at = models.DateTimeField(null=True, blank=True)
    last_down_at = models.DateTimeField(null=True, blank=True)
    low_since = models.DateTimeField(null=True, blank=True, help_text="Since when every signal has been low "
                                     "(hysteresis: a scale-down waits for TESSERA_AUTOSCALE_DOWN_STABLE_SECONDS).")
    recommended = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=32, blank=True)
    detail = models.CharField(max_length=300, blank=True)
    signals = models.JSONField(default=dict, blank=True)
    ups = models.PositiveIntegerField(default=0)
    downs = models.PositiveIntegerField(default=0)
    cold_starts = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"autoscaler of {self.deployment_id}"


class LoadCurve(models.Model):
    """The latest load curve a worker class measured for a deployment: what its steps cost on that
    hardware (dataplane/engine/load_curve.py, reported with a replica's "ready"). Capacity planning
    (capacity/, `manage.py capacity_plan`) reads it; a newer measurement replaces the older one."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="load_curves")
    worker_class = models.CharField(max_length=128)
    worker = models.CharField(max_length=128, help_text="The worker that measured it.")
    engine_args = models.JSONField(default=dict, blank=True, help_text="The deployment's engine_args then.")
    curve = models.JSONField()
    measured_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["deployment", "worker_class"], name="one_curve_per_class")]

    def __str__(self) -> str:
        return f"load curve of {self.deployment_id} on {self.worker_class}"
