"""Each deployments admin action needs its own permission. Django offers and runs an action that names
none to anyone who may see the list; so a read-only role (view permissions only, the smallest that
opens these pages) could drain, kill, release, retry, reconcile and delete."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from controlplane.deployments import reconciler, services
from controlplane.deployments.models import Deployment, Replica, ReplicaStatus, Worker

pytestmark = pytest.mark.django_db

VIEW = ["view_worker", "view_deployment", "view_replica", "view_adapter", "view_model"]
ACTIONS = [  # page, action, the permission it needs
    ("worker", "drain", "drain_worker"),
    ("worker", "uncordon", "drain_worker"),
    ("worker", "mark_dead", "mark_dead_worker"),
    ("worker", "release", "release_worker"),
    ("deployment", "retry_failed", "retry_deployment"),
    ("deployment", "reconcile_now", "reconcile_deployment"),
    ("deployment", "delete_through_service", "delete_deployment"),
    ("adapter", "delete_through_service", "delete_adapter"),
    ("replica", "retry", "retry_replica"),
]


def staff_with(django_user_model, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(f"ro-{len(codenames)}-{'-'.join(codenames)[:40]}", password="pw",
                                                 is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="deployments", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def fleet(make_worker, make_model, make_tenant, commit, sent):
    """A worker holding a replica of a deployment (then failed), and a tenant's adapter."""
    worker = make_worker("w1")
    model = make_model()
    deployment = services.deployment_create(model=model, replicas=1)
    tenant, _ = make_tenant("Acme")
    adapter = services.adapter_create(tenant=tenant, name="sql", base_model=model, source="sql")
    with commit():
        reconciler.reconcile()
    replica = Replica.objects.get()
    services.replica_report(worker=worker, replica_id=replica.pk, attempt=1, status="failed", reason="boom",
                            permanent=True)
    return {"worker": worker, "deployment": deployment, "adapter": adapter, "replica": Replica.objects.get()}


def state() -> tuple:
    """Everything an action could change."""
    from controlplane.deployments.models import Adapter

    workers = list(Worker.objects.values_list("name", "status", "cordoned", "boot_id"))
    deployments = list(Deployment.objects.values_list("name", "deleting"))
    replicas = list(Replica.objects.values_list("pk", "status", "attempt", "worker_id"))
    adapters = list(Adapter.objects.values_list("pk", "status"))
    return workers, deployments, replicas, adapters


def run(client: Client, fleet: dict, page: str, action: str, commit):
    with commit():
        return client.post(f"/admin/deployments/{page}/", {"action": action, "_selected_action": [fleet[page].pk]})


def test_a_read_only_role_sees_no_action_and_runs_none(fleet, django_user_model, commit):
    client = staff_with(django_user_model, *VIEW)
    for page in ("worker", "deployment", "replica", "adapter"):
        listing = client.get(f"/admin/deployments/{page}/")
        assert listing.status_code == 200, page  # it may look
        assert not listing.context["cl"].model_admin.get_actions(listing.wsgi_request), page
    before = state()
    for page, action, _ in ACTIONS:
        run(client, fleet, page, action, commit)
        assert state() == before, (page, action)


@pytest.mark.parametrize(("page", "action", "permission"), ACTIONS, ids=[f"{p}.{a}" for p, a, _ in ACTIONS])
def test_each_action_needs_its_own_permission(fleet, django_user_model, commit, page, action, permission):
    if action == "uncordon":  # something to undo
        services.worker_cordon(worker=fleet["worker"], cordoned=True)
    others = {p for _, _, p in ACTIONS} - {permission}
    client = staff_with(django_user_model, *VIEW, *others)  # every other action's permission: still not this one
    listing = client.get(f"/admin/deployments/{page}/")
    assert action not in listing.context["cl"].model_admin.get_actions(listing.wsgi_request)
    before = state()
    run(client, fleet, page, action, commit)
    assert state() == before
    client = staff_with(django_user_model, *VIEW, permission)
    listing = client.get(f"/admin/deployments/{page}/")
    assert action in listing.context["cl"].model_admin.get_actions(listing.wsgi_request)
    run(client, fleet, page, action, commit)
    if action != "reconcile_now":  # with nothing to do the reconciler changes nothing: it ran, that is all
        assert state() != before, (page, action)


def test_operators_hold_every_action_permission(fleet, make_user, commit):
    operator = make_user("ops", role="operator")
    assert all(operator.has_perm(f"deployments.{p}") for _, _, p in ACTIONS)
    client = Client()
    client.force_login(operator)
    run(client, fleet, "worker", "mark_dead", commit)
    assert Worker.objects.get().status == "dead"
    assert Replica.objects.get().status in (ReplicaStatus.PENDING, ReplicaStatus.FAILED)
