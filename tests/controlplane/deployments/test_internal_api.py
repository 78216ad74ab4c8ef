"""The worker-facing internal API: token, registration, heartbeats, specs and reports over HTTP."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from controlplane.deployments import reconciler, services
from controlplane.deployments.models import Replica, Worker

pytestmark = pytest.mark.django_db

TOKEN = "worker-secret"


@pytest.fixture
def worker_client(client, settings):
    settings.TESSERA_INTERNAL_TOKEN = TOKEN

    def call(method: str, path: str, body: dict | None = None, token: str | None = TOKEN, boot: str | None = None,
             **extra):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
        if boot is not None:
            headers["HTTP_X_TESSERA_BOOT_ID"] = boot
        fn = getattr(client, method)
        kwargs = {"data": body, "content_type": "application/json"} if body is not None else {}
        return fn(f"/internal/v1/{path}", **kwargs, **headers, **extra)

    return call


def register(call, name="w1", boot="b1"):
    return call("post", "workers/register", {"name": name, "url": f"http://{name}:8100", "boot_id": boot,
                                              "accelerator": "cpu", "memory_bytes": 2**34, "status": "ready"})


def test_the_worker_token_is_required(worker_client, settings, client):
    assert worker_client("post", "workers/register", {}, token=None).status_code == 401
    assert worker_client("post", "workers/register", {}, token="wrong").status_code == 401
    settings.TESSERA_WORKER_TOKEN = "gateway-to-worker"  # the gateway's token opens workers, not this API
    assert worker_client("post", "workers/register", {}, token="gateway-to-worker").status_code == 401
    assert register(worker_client).status_code == 200
    settings.TESSERA_INTERNAL_TOKEN = ""  # no token configured: loopback callers only
    assert client.post("/internal/v1/workers/w1/heartbeat", {"boot_id": "b1", "status": "ready"},
                       content_type="application/json", REMOTE_ADDR="10.1.2.3").status_code == 401
    assert client.post("/internal/v1/workers/w1/heartbeat", {"boot_id": "b1", "status": "ready"},
                       content_type="application/json").status_code == 200
    assert client.get("/internal/v1/health").json() == {"status": "ok"}


def test_register_heartbeat_and_reregistration(worker_client):
    answer = register(worker_client).json()
    assert answer["queue"] == "worker.w1" and answer["heartbeat_seconds"] == 2
    beat = {"boot_id": "b1", "status": "ready", "running": 3, "waiting": 1, "kv_cache_usage": 0.25,
            "slot": {"state": "idle"}, "stats": {"engine_builds": 0}}
    assert worker_client("post", "workers/w1/heartbeat", beat).status_code == 200
    worker = Worker.objects.get(name="w1")
    assert (worker.num_running, worker.num_waiting, worker.kv_cache_usage) == (3, 1, 0.25)
    assert worker.stats["engine_builds"] == 0 and worker.stats["slot"] == {"state": "idle"}
    assert worker_client("post", "workers/nobody/heartbeat", beat).status_code == 404  # -> the agent registers
    assert worker_client("post", "workers/w1/heartbeat", {**beat, "boot_id": "other"}).status_code == 409
    assert worker_client("post", "workers/w1/heartbeat", {**beat, "status": "dead"}).status_code == 400


def test_spec_and_report_of_an_assigned_replica(worker_client, make_model, django_capture_on_commit_callbacks):
    register(worker_client)
    register(worker_client, name="w2", boot="b2")
    services.deployment_create(model=make_model(context_length=2048), replicas=1,
                               engine_args={"kv_cache_memory": "256MiB"}, placement={"workers": ["w1"]})
    reconciler.reconcile()
    replica = Replica.objects.get()
    assert worker_client("get", f"workers/w1/replicas/{replica.pk}").status_code == 409  # no boot id
    assert worker_client("get", f"workers/w1/replicas/{replica.pk}", boot="b2").status_code == 409  # w2's boot
    spec = worker_client("get", f"workers/w1/replicas/{replica.pk}", boot="b1").json()
    assert spec["uid"] == str(replica.uid) and spec["attempt"] == 1 and spec["status"] == "loading"
    assert spec["model"]["source"] == "smollm2-135m-instruct" and spec["served_name"] == "smollm2-135m-instruct"
    assert spec["engine_args"] == {"kv_cache_memory": "256MiB", "max_model_len": 2048}
    assert spec["engine_quantization"] is None
    assert worker_client("get", f"workers/w2/replicas/{replica.pk}", boot="b2").status_code == 404  # not its replica
    ok = worker_client("post", f"workers/w1/replicas/{replica.pk}/status",
                       {"attempt": 1, "status": "ready", "load_seconds": 4.2}, boot="b1")
    assert ok.json() == {"applied": True, "status": "ready"}
    replica.refresh_from_db()
    assert replica.status == "ready" and replica.load_seconds == 4.2
    bad = worker_client("post", f"workers/w1/replicas/{replica.pk}/status", {"attempt": 1, "status": "exploded"},
                        boot="b1")
    assert bad.status_code == 400


def test_another_process_cannot_take_over_a_live_workers_name_or_url(worker_client):
    assert register(worker_client).status_code == 200
    taken = worker_client("post", "workers/register", {"name": "w1", "url": "http://evil:8100", "boot_id": "evil",
                                                       "status": "ready"})
    assert taken.status_code == 409 and taken.json()["code"] == "worker_name_taken"
    copied = worker_client("post", "workers/register", {"name": "w9", "url": "http://w1:8100", "boot_id": "evil",
                                                        "status": "ready"})
    assert copied.status_code == 409 and copied.json()["code"] == "worker_url_taken"
    worker = Worker.objects.get(name="w1")
    assert (worker.url, worker.boot_id) == ("http://w1:8100", "b1") and not Worker.objects.filter(name="w9").exists()
    # Without its boot id nobody can act as w1: not read its work, not release it, not heartbeat.
    assert worker_client("post", "workers/w1/release", {}, boot="evil").status_code == 409
    assert worker_client("post", "workers/w1/heartbeat", {"boot_id": "evil", "status": "ready"}).status_code == 409
    assert register(worker_client).status_code == 200  # the same boot registering again is fine


def test_the_legit_worker_registers_again_after_a_restart(worker_client, settings):
    register(worker_client)
    # A clean stop releases the name (the agent does it on exit): the next boot registers at once.
    assert worker_client("post", "workers/w1/release", {}, boot="b1").json() == {"released": True, "worker": "w1"}
    assert Worker.objects.get(name="w1").status == "dead"
    assert register(worker_client, boot="b2").status_code == 200
    # A crash leaves the old registration until it expires (no heartbeat for TESSERA_WORKER_DEAD_SECONDS).
    assert register(worker_client, boot="b3").status_code == 409
    Worker.objects.filter(name="w1").update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=16))
    assert register(worker_client, boot="b3").status_code == 200
    assert Worker.objects.get(name="w1").boot_id == "b3"


def test_an_operator_releases_a_registration_from_the_admin(worker_client, admin_client):
    register(worker_client)
    worker = Worker.objects.get(name="w1")
    page = admin_client.post("/admin/deployments/worker/", {"action": "release", "_selected_action": [worker.pk]})
    assert page.status_code == 302
    assert Worker.objects.get(name="w1").boot_id == ""
    assert register(worker_client, boot="b2").status_code == 200


def test_an_operator_releases_a_registration_from_the_command_line(worker_client, capsys):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    register(worker_client)
    assert register(worker_client, boot="b2").status_code == 409
    call_command("worker_release", "w1")
    assert "released w1" in capsys.readouterr().out
    assert register(worker_client, boot="b2").status_code == 200
    with pytest.raises(CommandError):
        call_command("worker_release", "nobody")
