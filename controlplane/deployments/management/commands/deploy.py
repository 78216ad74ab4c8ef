"""`python manage.py deploy --model smollm2-135m-instruct --replicas 1 [--quantization awq] [--min-replicas 0 --max-replicas 4]`

Creates the model entry if it is new (its source defaults to the name: a package alias), then
creates the deployment or scales the existing one. `--wait N` waits up to N seconds for the
replicas to be ready (needs the reconciler running: a Celery worker and beat). Prints JSON.
"""

from __future__ import annotations

import json
import time

from django.core.management.base import BaseCommand, CommandError

from common.errors import ApplicationError
from controlplane.deployments import selectors, services
from controlplane.deployments.api.serializers import DeploymentSerializer
from controlplane.deployments.models import Model, ReplicaStatus


class Command(BaseCommand):
    help = "Deploy a model (or scale its deployment); prints the deployment as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--model", required=True, help="model name (registered, or a package alias)")
        parser.add_argument("--replicas", type=int, default=1)
        parser.add_argument("--quantization", default="bf16", help="bf16, fp8 or awq (awq-int4)")
        parser.add_argument("--name", help="deployment name (default: the model name, plus -<quantization>)")
        parser.add_argument("--source", help="for a new model: alias, path or object-store URI (default: --model)")
        parser.add_argument("--quantized-source", help="for --quantization awq: the prebuilt AWQ checkpoint")
        parser.add_argument("--served-name", help="the id clients send (default: the model name)")
        parser.add_argument("--placement", help='JSON, e.g. {"accelerator": "H100"}')
        parser.add_argument("--engine-args", help='JSON, e.g. {"kv_cache_memory": "8GiB"}')
        parser.add_argument("--max-adapters", type=int, help="LoRA slots per replica (0: none)")
        parser.add_argument("--min-replicas", type=int, help="autoscaling's floor (0: scale to zero when idle)")
        parser.add_argument("--max-replicas", help="autoscaling's ceiling; 'none' turns autoscaling off")
        parser.add_argument("--wait", type=float, default=0, help="seconds to wait for every replica to be ready")

    def handle(self, *args, **opts):
        try:
            model = self._model(opts)
            fields = {key: value for key, value in {
                "served_name": opts["served_name"], "placement": _json(opts["placement"], "--placement"),
                "engine_args": _json(opts["engine_args"], "--engine-args"), "max_adapters": opts["max_adapters"],
            }.items() if value is not None}
            if opts["min_replicas"] is not None:
                fields["min_replicas"] = opts["min_replicas"]
            if opts["max_replicas"] is not None:
                fields["max_replicas"] = _bound(opts["max_replicas"])
            deployment, created = services.deployment_apply(
                model=model, replicas=opts["replicas"], quantization=opts["quantization"], name=opts["name"],
                **fields)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        if opts["wait"]:
            self._wait(deployment.name, opts["wait"])
        data = DeploymentSerializer(selectors.deployment_get(name=deployment.name)).data
        self.stdout.write(json.dumps({"created": created, "deployment": data}, indent=2, default=str))

    def _model(self, opts) -> Model:
        model = Model.objects.filter(name=opts["model"]).first()
        quantization = services.quantization_normalize(opts["quantization"])
        if model is None:
            quantizations = ["bf16"] if quantization == "bf16" else ["bf16", quantization]
            model = services.model_create(name=opts["model"], source=opts["source"] or opts["model"],
                                          quantizations=quantizations)
        # fp8 is made at load and gguf reads the file's own blocks: neither needs a prebuilt checkpoint
        if quantization not in model.quantizations and quantization in ("fp8", "gguf"):
            model = services.model_update(model=model, quantizations=[*model.quantizations, quantization])
        if opts["quantized_source"]:
            sources = {**model.quantized_sources, quantization: opts["quantized_source"]}
            quantizations = sorted({*model.quantizations, quantization})
            model = services.model_update(model=model, quantized_sources=sources, quantizations=quantizations)
        return model

    def _wait(self, name: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            deployment = selectors.deployment_get(name=name)
            replicas = list(deployment.replicas.all())
            if len(replicas) >= deployment.desired_replicas and all(
                    r.status == ReplicaStatus.READY for r in replicas):
                return
            failed = [r for r in replicas if r.status == ReplicaStatus.FAILED and r.retry_at is None]
            if failed:
                raise CommandError(f"replica {failed[0].pk} failed: {failed[0].reason}")
            time.sleep(1)
        raise CommandError(f"deployment {name!r} not ready after {seconds:.0f} s")


def _json(raw: str | None, flag: str):
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApplicationError(f"{flag}: not JSON ({exc})", code="invalid_value") from None


def _bound(value: str) -> int | None:
    if value.strip().lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise CommandError(f"--max-replicas: an integer or 'none', got {value!r}") from None
