"""The files-and-batches admin: operators find a tenant's batch and its lines and can cancel it (through
the tenant's own cancel service); finance and plain staff see none of it; nothing there can be edited."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.utils import timezone

from controlplane.batches.models import Batch, BatchLine


def _change_url(batch: Batch) -> str:
    # The admin escapes a key's "_" as "_5F" (django.contrib.admin.utils.quote), as its own links do:
    # the raw id of a batch whose hex starts with 25, 2F, 3A... would unquote to another id.
    return f"/admin/batches/batch/{quote(batch.pk)}/change/"

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def batch():
    from tenants import services

    tier = services.tier_create(name=f"bulk-{uuid.uuid4().hex[:6]}", priority=20)
    tenant = services.tenant_create_with_key(name=f"Bulk {uuid.uuid4().hex[:4]}", tier=tier)[0]
    batch = Batch.objects.create(id=f"batch_{uuid.uuid4().hex[:24]}", tenant=tenant, endpoint="/v1/chat/completions",
                                 input_file_id="file-x", status=Batch.Status.IN_PROGRESS, request_total=2,
                                 expires_at=timezone.now() + dt.timedelta(hours=24))
    for i, state in enumerate([BatchLine.State.SUCCEEDED, BatchLine.State.PENDING]):
        BatchLine.objects.create(batch=batch, line_no=i, custom_id=f"line-{i}", body={}, state=state,
                                 request_id=f"req_b{i}_{uuid.uuid4().hex[:8]}")
    return batch


def test_operators_find_a_batch_and_its_lines_and_cancel_it(make_user, batch):
    client = logged_in(make_user("olga", role="operator", is_staff=True))
    page = client.get("/admin/batches/batch/", {"q": batch.pk})
    assert page.status_code == 200 and batch.pk in page.content.decode()
    lines = client.get("/admin/batches/batchline/", {"q": batch.pk, "state__exact": "pending"})
    assert lines.status_code == 200 and "line-1" in lines.content.decode() and "line-0" not in lines.content.decode()
    assert client.get(_change_url(batch)).status_code == 200  # a read-only page

    answer = client.post("/admin/batches/batch/", {"action": "cancel_batches", "_selected_action": [batch.pk]})
    assert answer.status_code == 302
    batch.refresh_from_db()
    assert batch.status in (Batch.Status.CANCELLING, Batch.Status.CANCELLED)
    assert BatchLine.objects.get(batch=batch, line_no=0).state == BatchLine.State.SUCCEEDED  # answered lines kept


def test_nothing_in_the_batch_admin_can_be_edited_or_deleted(make_user, batch):
    client = logged_in(make_user("oscar", role="operator", is_staff=True))
    assert client.post(_change_url(batch), {"status": "completed"}).status_code == 403
    assert client.post(f"/admin/batches/batch/{quote(batch.pk)}/delete/", {"post": "yes"}).status_code == 403
    batch.refresh_from_db()
    assert batch.status == Batch.Status.IN_PROGRESS


@pytest.mark.parametrize("role", ["finance", None])
def test_finance_and_plain_staff_see_no_batches(make_user, batch, role):
    client = logged_in(make_user(f"u-{role}", role=role, is_staff=True))
    assert client.get("/admin/batches/batch/").status_code == 403
    answer = client.post("/admin/batches/batch/", {"action": "cancel_batches", "_selected_action": [batch.pk]})
    assert answer.status_code == 403
    batch.refresh_from_db()
    assert batch.status == Batch.Status.IN_PROGRESS
