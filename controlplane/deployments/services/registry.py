"""Writes to what should run: models, deployments, adapters. The reconciler does the rest."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from common.errors import ApplicationError
from controlplane import audit
from tenants.models import Tenant

from .. import adapter_store, dispatch
from ..models import (
    QUANTIZATION_ALIASES,
    Adapter,
    AdapterStatus,
    Deployment,
    Model,
    PlacementStatus,
    Quantization,
    Replica,
    ReplicaStatus,
)
from ..models import name_validator as _name_validator

PLACEMENT_KEYS = {"accelerator", "min_memory_gib", "labels", "workers"}
ENGINE_ARGS = {"dtype", "weight_dtype", "kv_cache_memory", "block_size", "max_model_len", "max_num_seqs",
               "max_num_batched_tokens", "enable_prefix_caching", "seed", "max_waiting", "max_loras", "max_lora_rank",
               "tool_call_parser", "tensor_parallel_size", "kv_cache_dtype", "kv_offload_size"}
TOOL_CALL_PARSERS = ("auto", "none", "hermes", "llama3_json", "pythonic")  # the worker's tool_call_parser
KV_CACHE_DTYPES = ("auto", "fp8")  # the engine's kv_cache_dtype (dataplane/config.py); fp8 is gated at load
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmg](i?b)?|b)?\s*", re.IGNORECASE)  # as the engine's parse_bytes
MODEL_FIELDS = {"source", "architecture", "context_length", "quantizations", "quantized_sources", "description"}


def _invalid(message: str, param: str, code: str = "invalid_value") -> ApplicationError:
    return ApplicationError(message, code=code, param=param)


def _check_name(value: str, param: str) -> None:
    try:
        _name_validator(value)
    except ValidationError:
        raise _invalid(f"{param}: {value!r} may hold only letters, digits, '.', '-' and '_'.", param) from None


def quantization_normalize(value: str | None) -> str:
    key = (value or "bf16").strip().lower()
    if key not in QUANTIZATION_ALIASES:
        raise _invalid(f"quantization: {value!r} is not one of {', '.join(Quantization.values)}.", "quantization")
    return QUANTIZATION_ALIASES[key]


def _check_quantizations(values: Any) -> list[str]:
    if not isinstance(values, list) or not values:
        raise _invalid("quantizations: a non-empty list such as [\"bf16\", \"fp8\"].", "quantizations")
    return sorted({quantization_normalize(v) for v in values}, key=Quantization.values.index)


def _check_no_nul(value: Any, param: str) -> None:
    """PostgreSQL's jsonb refuses a NUL character (a 400 from the database's error) and SQLite stores it: refuse it
    here so both answer alike, and no worker or label match ever sees one."""
    if isinstance(value, str) and "\x00" in value:
        raise _invalid(f"{param}: the NUL character (\\u0000) is not allowed.", param)
    if isinstance(value, dict):
        for key, item in value.items():
            _check_no_nul(key, param)
            _check_no_nul(item, param)
    elif isinstance(value, list):
        for item in value:
            _check_no_nul(item, param)


def _check_placement(placement: Any) -> dict:
    if not isinstance(placement, dict):
        raise _invalid("placement: an object.", "placement")
    _check_no_nul(placement, "placement")
    unknown = set(placement) - PLACEMENT_KEYS
    if unknown:
        raise _invalid(f"placement: unknown keys {sorted(unknown)} (use {sorted(PLACEMENT_KEYS)}).", "placement")
    if not isinstance(placement.get("labels", {}), dict):
        raise _invalid("placement.labels: an object of label: value.", "placement")
    if not isinstance(placement.get("workers", []), list):
        raise _invalid("placement.workers: a list of worker names.", "placement")
    if "min_memory_gib" in placement and not isinstance(placement["min_memory_gib"], int | float):
        raise _invalid("placement.min_memory_gib: a number.", "placement")
    return placement


def _check_prefill(prefill_replicas: int, engine_args: dict) -> int:
    """Prefill replicas need the serving replicas to keep what they receive: a second tier."""
    if not isinstance(prefill_replicas, int) or isinstance(prefill_replicas, bool) or not 0 <= prefill_replicas <= 64:
        raise _invalid("prefill_replicas: an integer from 0 to 64.", "prefill_replicas")
    size = engine_args.get("kv_offload_size", 0)
    if prefill_replicas and size in (0, "0"):
        raise _invalid("prefill_replicas: the serving replicas keep the blocks prefill replicas send in the prefix "
                       "cache's second tier; set engine_args.kv_offload_size (e.g. \"4GiB\") too.", "prefill_replicas")
    return prefill_replicas


def _check_engine_args(engine_args: Any) -> dict:
    if not isinstance(engine_args, dict):
        raise _invalid("engine_args: an object.", "engine_args")
    _check_no_nul(engine_args, "engine_args")
    unknown = set(engine_args) - ENGINE_ARGS
    if unknown:
        raise _invalid(f"engine_args: unknown keys {sorted(unknown)} (use {sorted(ENGINE_ARGS)}).", "engine_args")
    if "tool_call_parser" in engine_args and engine_args["tool_call_parser"] not in TOOL_CALL_PARSERS:
        raise _invalid(f"engine_args.tool_call_parser: one of {list(TOOL_CALL_PARSERS)}.", "engine_args")
    if "kv_cache_dtype" in engine_args and engine_args["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        raise _invalid(f"engine_args.kv_cache_dtype: one of {list(KV_CACHE_DTYPES)} (fp8: E4M3 with per-token "
                       "scales, twice the blocks, served only after its quality gate passes).", "engine_args")
    if "kv_offload_size" in engine_args:
        # host memory for the prefix cache's second tier; a directory is the worker's own flag
        # (--kv-offload-dir): where a worker writes on its disk is its operator's choice, not a deployment's
        size = engine_args["kv_offload_size"]
        m = _SIZE.fullmatch(size) if isinstance(size, str) else None
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0
                or m is not None and (float(m.group(1)) > 0 or size.strip() == "0")):
            raise _invalid("engine_args.kv_offload_size: a size such as \"8GiB\" or a byte count (0: no second "
                           "tier of the prefix cache).", "engine_args")
    tp = engine_args.get("tensor_parallel_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or not 1 <= tp <= 1024:
        raise _invalid("engine_args.tensor_parallel_size: an integer from 1 (one device per replica) up; the "
                       "reconciler places the replica on a worker advertising at least that many devices.",
                       "engine_args")
    return engine_args


UNSET: Any = object()  # deployment_update: "not given" (None is a value: max_replicas None turns autoscaling off)


def replica_bounds(*, min_replicas: int, max_replicas: int | None, replicas: int) -> int:
    """Check autoscaling's bounds; -> the desired count, clamped into them when autoscaled.

    An operator's `replicas` on an autoscaled deployment is where the autoscaler starts from: it is
    kept within [min, max] so the bounds hold from the first pass (the autoscaler moves it after)."""
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise _invalid("min_replicas: an integer >= 0 (0: scale to zero when idle).", "min_replicas")
    if max_replicas is None:
        return replicas
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
        raise _invalid("max_replicas: an integer >= 1, or null for no autoscaling.", "max_replicas")
    if max_replicas < min_replicas:
        raise _invalid(f"max_replicas: {max_replicas} is below min_replicas {min_replicas}; the autoscaler "
                       "needs min_replicas <= max_replicas.", "max_replicas")
    return min(max(replicas, min_replicas), max_replicas)


# --- models ---------------------------------------------------------------------------------------

def model_create(*, name: str, source: str = "", architecture: str = "llama", context_length: int | None = None,
                 quantizations: list[str] | None = None, quantized_sources: dict | None = None,
                 description: str = "") -> Model:
    _check_name(name, "name")
    fields = {"source": source or name, "architecture": architecture, "context_length": context_length,
              "quantizations": _check_quantizations(quantizations or ["bf16"]),
              "quantized_sources": quantized_sources or {}, "description": description}
    try:
        with transaction.atomic():
            model = Model.objects.create(name=name, **fields)
            audit.record("model.create", model)
            return model
    except IntegrityError:
        raise ApplicationError(f"Model {name!r} already exists.", code="model_exists", status=409) from None


def model_update(*, model: Model, **fields) -> Model:
    unknown = set(fields) - MODEL_FIELDS
    if unknown:
        raise _invalid(f"Unknown model fields: {sorted(unknown)}.", sorted(unknown)[0], "invalid_field")
    if "quantizations" in fields:
        fields["quantizations"] = _check_quantizations(fields["quantizations"])
    with transaction.atomic(), audit.change("model.update", model):
        for key, value in fields.items():
            setattr(model, key, value)
        model.save()
        if fields.keys() & {"source", "quantized_sources", "context_length"}:
            _replicas_retry(Replica.objects.filter(deployment__model=model, status=ReplicaStatus.FAILED))
    return model


def model_delete(*, model: Model) -> None:
    try:
        with transaction.atomic(), audit.change("model.delete", model):
            model.delete()
    except ProtectedError:
        raise ApplicationError(f"Model {model.name!r} still has deployments or adapters.", code="model_in_use",
                               status=409) from None


# --- deployments ----------------------------------------------------------------------------------

def deployment_create(*, model: Model, replicas: int = 1, quantization: str = "bf16", name: str | None = None,
                      served_name: str | None = None, placement: dict | None = None,
                      engine_args: dict | None = None, max_adapters: int = 0, min_replicas: int = 1,
                      max_replicas: int | None = None, prefill_replicas: int = 0) -> Deployment:
    quantization = quantization_normalize(quantization)
    if quantization not in model.quantizations:
        raise ApplicationError(f"Model {model.name!r} is not available as {quantization} (it has "
                               f"{', '.join(model.quantizations)}).", code="quantization_unavailable",
                               param="quantization")
    if replicas < 0:
        raise _invalid("replicas: must be >= 0.", "replicas")
    replicas = replica_bounds(min_replicas=min_replicas, max_replicas=max_replicas, replicas=replicas)
    name = name or (model.name if quantization == Quantization.BF16 else f"{model.name}-{quantization}")
    _check_name(name, "name")
    served_name = served_name or model.name
    _check_name(served_name, "served_name")
    try:
        with transaction.atomic():
            engine_args = _check_engine_args(engine_args or {})
            deployment = Deployment.objects.create(
                name=name, model=model, quantization=quantization, desired_replicas=replicas, served_name=served_name,
                placement=_check_placement(placement or {}), engine_args=engine_args,
                max_adapters=max_adapters, min_replicas=min_replicas, max_replicas=max_replicas,
                prefill_replicas=_check_prefill(prefill_replicas, engine_args))
            audit.record("deployment.create", deployment)
            dispatch.reconcile_soon()
    except IntegrityError:
        raise ApplicationError(f"Deployment {name!r} already exists.", code="deployment_exists", status=409) from None
    return deployment


def deployment_update(*, deployment: Deployment, replicas: int | None = None, placement: dict | None = None,
                      engine_args: dict | None = None, max_adapters: int | None = None,
                      min_replicas: int = UNSET, max_replicas: int | None = UNSET,
                      prefill_replicas: int | None = None) -> Deployment:
    """Scale or reconfigure. A changed spec gives failed replicas a fresh start. Bounds are checked
    against the stored ones (a PATCH of max_replicas alone below the stored min is refused)."""
    if replicas is not None and replicas < 0:
        raise _invalid("replicas: must be >= 0.", "replicas")
    with transaction.atomic(), audit.change("deployment.update", deployment):
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if deployment.deleting:
            raise ApplicationError(f"Deployment {deployment.name!r} is being deleted.", code="deployment_deleting",
                                   status=409)
        respec = False
        if replicas is not None:
            deployment.desired_replicas = replicas
        if min_replicas is not UNSET:
            deployment.min_replicas = min_replicas
        if max_replicas is not UNSET:
            deployment.max_replicas = max_replicas
        deployment.desired_replicas = replica_bounds(min_replicas=deployment.min_replicas,
                                                     max_replicas=deployment.max_replicas,
                                                     replicas=deployment.desired_replicas)
        if placement is not None:
            deployment.placement, respec = _check_placement(placement), True
        if engine_args is not None:
            deployment.engine_args, respec = _check_engine_args(engine_args), True
        if max_adapters is not None:
            deployment.max_adapters, respec = max_adapters, True
        if prefill_replicas is not None:
            deployment.prefill_replicas = prefill_replicas
        deployment.prefill_replicas = _check_prefill(deployment.prefill_replicas, deployment.engine_args)
        deployment.save()
        if respec:
            _replicas_retry(deployment.replicas.filter(status=ReplicaStatus.FAILED))
        dispatch.reconcile_soon()
    return deployment


def deployment_apply(*, model: Model, replicas: int, quantization: str = "bf16", name: str | None = None,
                     **fields) -> tuple[Deployment, bool]:
    """Create the deployment, or scale the existing one of that name (the CLI's `deploy`). -> (it, created)"""
    quantization = quantization_normalize(quantization)
    name = name or (model.name if quantization == Quantization.BF16 else f"{model.name}-{quantization}")
    existing = Deployment.objects.filter(name=name).first()
    if existing is None:
        return deployment_create(model=model, replicas=replicas, quantization=quantization, name=name, **fields), True
    if existing.model_id != model.pk or existing.quantization != quantization:
        raise ApplicationError(f"Deployment {name!r} serves {existing.model.name} at {existing.quantization}; "
                               "pick another name.", code="deployment_exists", status=409)
    fields.pop("served_name", None)
    return deployment_update(deployment=existing, replicas=replicas, **fields), False


def deployment_delete(*, deployment: Deployment) -> None:
    """Scale to zero; the reconciler unloads the replicas and then removes the deployment."""
    with transaction.atomic(), audit.change("deployment.delete", deployment):
        Deployment.objects.filter(pk=deployment.pk).update(deleting=True, desired_replicas=0)
        dispatch.reconcile_soon()


def replica_retry(*, replica: Replica) -> Replica:
    """An operator's fresh start for a failed replica (its failure count resets)."""
    if replica.status != ReplicaStatus.FAILED:
        raise ApplicationError(f"Replica {replica.pk} is {replica.status}, not failed.", code="replica_not_failed",
                               status=409)
    with transaction.atomic():
        _replicas_retry(Replica.objects.filter(pk=replica.pk))
    replica.refresh_from_db()
    return replica


def _replicas_retry(queryset) -> int:
    count = queryset.update(status=ReplicaStatus.PENDING, failures=0, retry_at=None, worker=None,
                            reason="retrying (reset)")
    if count:
        dispatch.reconcile_soon()
    return count


# --- adapters -------------------------------------------------------------------------------------

def adapter_create(*, tenant, name: str, base_model: Model, source: str, rank: int = 8) -> Adapter:
    """Register a tenant's adapter: its source must lie in the tenant's own store; at most
    TESSERA_MAX_ADAPTERS_PER_TENANT per tenant (LoRA slots are shared by all tenants)."""
    _check_name(name, "name")
    source = adapter_store.adapter_source_normalize(tenant=tenant, source=source)
    if not 1 <= rank <= 64:
        raise _invalid("rank: must be in [1, 64].", "rank")
    limit = adapter_store.adapter_limit()
    try:
        with transaction.atomic():
            Tenant.objects.select_for_update().filter(pk=tenant.pk).first()  # one registration at a time per tenant
            if Adapter.objects.filter(tenant=tenant).count() >= limit:
                raise ApplicationError(f"You have {limit} adapters, the most a tenant may register; delete one "
                                       "first.", code="adapter_limit_reached", status=409)
            adapter = Adapter.objects.create(tenant=tenant, name=name, served_name=f"{tenant.slug}:{name}",
                                             base_model=base_model, source=source, rank=rank)
            audit.record("adapter.create", adapter)
            dispatch.reconcile_soon()
    except IntegrityError:
        raise ApplicationError(f"Adapter {name!r} already exists.", code="adapter_exists", status=409) from None
    return adapter


def adapter_delete(*, adapter: Adapter) -> None:
    """Unload everywhere, then remove (at once when nothing is loaded)."""
    with transaction.atomic(), audit.change("adapter.delete", adapter):
        adapter = Adapter.objects.select_for_update().get(pk=adapter.pk)
        active = adapter.placements.filter(status__in=[PlacementStatus.LOADING, PlacementStatus.READY,
                                                       PlacementStatus.STOPPING])
        if not active.exists():
            adapter.delete()
            return
        adapter.status = AdapterStatus.DELETING
        adapter.save(update_fields=["status", "updated_at"])
        dispatch.reconcile_soon()
