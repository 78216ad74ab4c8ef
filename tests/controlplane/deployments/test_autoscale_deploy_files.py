"""deploy/k8s/autoscaling: KEDA makes the worker pods follow the reconciler's decision (no cluster here:
the files are parsed and checked for what matters)."""

from __future__ import annotations

from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
OVERLAY = K8S / "autoscaling"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_overlay_builds_on_the_base_and_hands_the_worker_count_to_keda():
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../", "scaledobject.yaml"]
    (patch,) = kustomization["patches"]
    assert patch["target"]["name"] == "tessera-gpu-worker"
    assert yaml.safe_load(patch["patch"]) == [{"op": "remove", "path": "/spec/replicas"}]
    base = {d["metadata"]["name"]: d for p in sorted(K8S.glob("*.yaml")) for d in docs(p) if d.get("kind") == "Deployment"}
    assert "replicas" in base["tessera-gpu-worker"]["spec"]  # what the patch removes exists


def test_the_scaled_object_follows_the_sum_of_desired_replicas_one_copy_per_deployment():
    (scaled,) = docs(OVERLAY / "scaledobject.yaml")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == "tessera-gpu-worker"
    assert scaled["spec"]["minReplicaCount"] == 0
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue" and meta["threshold"] == "1"
    # every web pod exports the same database-backed gauge: one copy per deployment before the sum
    assert meta["query"] == "sum(max by (deployment) (tessera:autoscaler_desired_replicas))"
    assert meta["ignoreNullValues"] == "false"  # Prometheus losing its targets must not read as "zero wanted"
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    from controlplane.deployments import conf

    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= conf.AUTOSCALE["TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS"]


def test_the_series_the_query_reads_is_exported_under_that_name():
    from controlplane.deployments.autoscale import metrics

    assert 'GaugeMetricFamily("tessera:autoscaler_desired_replicas"' in Path(metrics.__file__).read_text()


def test_an_idle_worker_is_not_ready_so_the_replica_set_removes_it_first():
    """A ReplicaSet scaling down deletes not-ready pods before ready ones: a worker whose replica was
    drained and unloaded fails /ready (no model), so KEDA's scale-down takes it, not a serving one."""
    worker = next(d for d in docs(K8S / "worker.yaml") if d["kind"] == "Deployment")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_the_alert_rules_read_the_exported_series():
    rules = yaml.safe_load((K8S.parent / "prometheus" / "tessera-autoscaler-rules.yml").read_text())["groups"][0]["rules"]
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert 'tessera:autoscaler_state{reason="at_max"}' in exprs["TesseraAutoscalerAtMax"]
    from controlplane.deployments.autoscale.policy import HOLD_REASONS

    assert "at_max" in HOLD_REASONS
    assert 'tessera:autoscaler_signal{signal="ready"}' in exprs["TesseraAutoscalerReplicasNotReady"]
