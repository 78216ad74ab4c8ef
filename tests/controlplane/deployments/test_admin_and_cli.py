"""Operators' admin pages and actions, the `deploy` command, and the beat schedule."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from controlplane.deployments import reconciler, services
from controlplane.deployments.models import Deployment, Model, Replica, Worker

pytestmark = pytest.mark.django_db


def test_admin_pages_render_and_actions_go_through_services(admin_client, sent, commit, make_worker, make_model,
                                                            make_tenant):
    worker = make_worker("w1")
    model = make_model()
    deployment = services.deployment_create(model=model, replicas=1)
    tenant, _ = make_tenant("Acme")
    services.adapter_create(tenant=tenant, name="sql", base_model=model, source="sql")
    with commit():
        reconciler.reconcile()
    for page in ("model", "adapter", "worker", "deployment", "replica"):
        listing = admin_client.get(f"/admin/deployments/{page}/")
        assert listing.status_code == 200, page
    assert "w1" in admin_client.get("/admin/deployments/worker/").content.decode()
    assert admin_client.get(f"/admin/deployments/deployment/{deployment.pk}/change/").status_code == 200
    assert admin_client.get("/admin/deployments/worker/?status__exact=ready").status_code == 200

    with commit():
        admin_client.post("/admin/deployments/worker/", {"action": "drain", "_selected_action": [worker.pk]})
    assert Worker.objects.get().cordoned
    replica = Replica.objects.get()
    services.replica_report(worker=worker, replica_id=replica.pk, attempt=1, status="failed", reason="boom",
                            permanent=True)
    with commit():
        admin_client.post("/admin/deployments/replica/", {"action": "retry", "_selected_action": [replica.pk]})
    assert Replica.objects.get().status == "pending"
    with commit():
        admin_client.post("/admin/deployments/worker/", {"action": "mark_dead", "_selected_action": [worker.pk]})
    assert Worker.objects.get().status == "dead"


def test_admin_add_deployment_refuses_an_unavailable_quantization(admin_client, make_model):
    model = make_model()
    form = {"name": "x", "model": model.pk, "quantization": "awq-int4", "desired_replicas": 1, "served_name": "",
            "placement": "{}", "engine_args": "{}", "max_adapters": 0,
            "replicas-TOTAL_FORMS": 0, "replicas-INITIAL_FORMS": 0}  # the (read-only) replica inline
    page = admin_client.post("/admin/deployments/deployment/add/", form)
    assert page.status_code == 200 and "not available as awq-int4" in page.content.decode()
    created = admin_client.post("/admin/deployments/deployment/add/", {**form, "quantization": "bf16"})
    assert created.status_code == 302 and Deployment.objects.get().served_name == model.name


def test_deploy_command_creates_then_scales(capsys, sent):
    call_command("deploy", "--model", "smollm2-135m-instruct", "--replicas", "1")
    out = json.loads(capsys.readouterr().out)
    assert out["created"] and out["deployment"]["replicas"] == 1 and out["deployment"]["quantization"] == "bf16"
    assert Model.objects.get().source == "smollm2-135m-instruct"
    call_command("deploy", "--model", "smollm2-135m-instruct", "--replicas", "3")
    out = json.loads(capsys.readouterr().out)
    assert not out["created"] and Deployment.objects.get().desired_replicas == 3
    call_command("deploy", "--model", "smollm2-135m-instruct", "--quantization", "fp8", "--replicas", "1")
    assert set(Deployment.objects.values_list("name", flat=True)) == {"smollm2-135m-instruct",
                                                                     "smollm2-135m-instruct-fp8"}
    with pytest.raises(CommandError, match="quantization_unavailable"):
        call_command("deploy", "--model", "smollm2-135m-instruct", "--quantization", "awq")
    call_command("deploy", "--model", "smollm2-135m-instruct", "--quantization", "awq",
                 "--quantized-source", "/models/smollm2-awq")
    awq = Deployment.objects.get(name="smollm2-135m-instruct-awq-int4")
    assert awq.engine_quantization == "awq" and awq.model.source_for("awq-int4") == "/models/smollm2-awq"
    # gguf reads the file's own blocks: like fp8, no prebuilt checkpoint is needed
    call_command("deploy", "--model", "smollm2-135m-instruct", "--quantization", "gguf", "--replicas", "1")
    gguf = Deployment.objects.get(name="smollm2-135m-instruct-gguf")
    assert gguf.engine_quantization == "gguf" and "gguf" in gguf.model.quantizations
    with pytest.raises(CommandError, match="invalid_value"):
        call_command("deploy", "--model", "smollm2-135m-instruct", "--placement", "{nope")


def test_beat_schedules_the_reconciler_and_billing_sweepers():
    from django.conf import settings

    import billing.tasks  # noqa: F401  (registers the billing tasks)
    import controlplane.audit.tasks  # noqa: F401  (the audit log's retention prune)
    import controlplane.batches.tasks  # noqa: F401  (resumes batches whose runner died)
    import controlplane.deployments.tasks  # noqa: F401
    import controlplane.gateway.tasks  # noqa: F401  (the usage sweeper)
    from controlplane.celery import app

    schedule = {entry["task"]: entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert set(schedule) == {"deployments.reconcile", "billing.stripe_report_pending", "billing.stripe_sync_pending",
                             "billing.usage_daily_rollup", "billing.invoices_build_month", "gateway.usage_sweep",
                             "audit.prune", "batches.resume", "gateway.responses_prune",
                             "billing.replica_spans_observe", "billing.cost_hours_rebuild"}
    assert schedule["gateway.usage_sweep"] == schedule["batches.resume"] == 60
    # unit economics: serving time sampled every minute; costs rebuilt for the last hours every 15
    # minutes and for two days once a day
    beat = settings.CELERY_BEAT_SCHEDULE
    assert schedule["billing.replica_spans_observe"] == 60
    assert beat["billing-cost-hours-rebuild"]["schedule"] == 900
    assert beat["billing-cost-hours-rebuild-daily"]["kwargs"] == {"hours": 48}
    assert schedule["gateway.responses_prune"] == 3600
    assert schedule["billing.stripe_report_pending"] == schedule["billing.stripe_sync_pending"] == 60
    assert schedule["billing.usage_daily_rollup"] == 900 and schedule["deployments.reconcile"] <= 10
    monthly = schedule["billing.invoices_build_month"]
    assert monthly.day_of_month == {1}
    for name in schedule:
        assert name in app.tasks, name
    import controlplane

    assert controlplane.celery_app is app
