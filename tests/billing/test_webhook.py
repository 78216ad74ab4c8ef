"""The Stripe webhook: signature checked by the SDK over the raw body; each event applied once."""

import hashlib
import hmac
import json
import time

import pytest
from django.urls import reverse

from billing import services
from billing.models import Invoice, StripeEvent

pytestmark = pytest.mark.django_db
SECRET = "whsec_test_secret"


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRET = SECRET
    settings.ROOT_URLCONF = "tests.billing.urls"


def sign(payload: bytes, *, secret: str = SECRET, timestamp: int | None = None) -> str:
    timestamp = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def post(client, payload: bytes, signature: str | None):
    headers = {"HTTP_STRIPE_SIGNATURE": signature} if signature is not None else {}
    return client.post(reverse("billing:stripe-webhook"), data=payload, content_type="application/json", **headers)


@pytest.fixture
def finalized(price, make_event, ingest, tenant):
    ingest(make_event())
    invoice = services.invoice_finalize(invoice=services.invoice_draft_build(tenant=tenant, month=price.effective_from.date()))
    Invoice.objects.filter(pk=invoice.pk).update(stripe_invoice_id="in_123", stripe_status="open")
    invoice.refresh_from_db()
    return invoice


def event(invoice, kind="invoice.paid", event_id="evt_1", paid_at=1_790_000_000) -> bytes:
    return json.dumps({
        "id": event_id, "object": "event", "type": kind, "livemode": False, "created": paid_at,
        "data": {"object": {"id": "in_123", "object": "invoice", "status": "paid" if kind == "invoice.paid" else "void",
                            "metadata": {"tessera_invoice_id": str(invoice.pk)},
                            "status_transitions": {"paid_at": paid_at}}},
    }).encode()


def snapshot(invoice):
    invoice.refresh_from_db()
    return invoice.status, invoice.paid_at, invoice.stripe_status, StripeEvent.objects.count()


@pytest.mark.parametrize(
    "signature",
    [
        None,  # no header
        "t=1,v1=deadbeef",  # garbage
        "bad-secret",  # right format, wrong secret (filled in below)
        "stale",  # right secret, timestamp outside the tolerance
        "tampered",  # signature of a different body
    ],
)
def test_bad_signature_is_400_and_changes_nothing(client, finalized, signature):
    payload = event(finalized)
    before = snapshot(finalized)
    if signature == "bad-secret":
        signature = sign(payload, secret="whsec_other")
    elif signature == "stale":
        signature = sign(payload, timestamp=int(time.time()) - 301)
    elif signature == "tampered":
        signature = sign(payload.replace(b"evt_1", b"evt_2"))
    response = post(client, payload, signature)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_signature"
    assert snapshot(finalized) == before


def test_paid_event_marks_the_invoice_paid(client, finalized):
    payload = event(finalized)
    response = post(client, payload, sign(payload))
    assert response.status_code == 200 and response.json() == {"received": True, "replayed": False, "outcome": "applied"}
    finalized.refresh_from_db()
    assert finalized.status == "paid" and finalized.stripe_status == "paid"
    assert int(finalized.paid_at.timestamp()) == 1_790_000_000


def test_replayed_event_is_a_no_op(client, finalized):
    payload = event(finalized)
    post(client, payload, sign(payload))
    after_first = snapshot(finalized)
    # the same event delivered again (Stripe retries), later, with a fresh valid signature
    response = post(client, payload, sign(payload, timestamp=int(time.time()) + 1))
    assert response.status_code == 200 and response.json()["replayed"] is True
    assert snapshot(finalized) == after_first


def test_void_event_voids_and_releases_usage(client, finalized):
    payload = event(finalized, kind="invoice.voided", event_id="evt_void")
    assert post(client, payload, sign(payload)).status_code == 200
    finalized.refresh_from_db()
    assert finalized.status == "void" and finalized.usage_records.count() == 0


def test_paid_event_for_a_void_invoice_is_recorded_and_ignored(client, finalized):
    services.invoice_void(invoice=finalized, from_stripe=True)
    payload = event(finalized)
    response = post(client, payload, sign(payload))
    assert response.status_code == 200 and response.json()["outcome"].startswith("ignored")
    finalized.refresh_from_db()
    assert finalized.status == "void"


def test_unknown_event_types_are_acknowledged(client, finalized):
    payload = json.dumps({"id": "evt_x", "type": "customer.created", "data": {"object": {}}}).encode()
    response = post(client, payload, sign(payload))
    assert response.status_code == 200 and response.json()["outcome"] == "ignored: event type not handled"


def test_webhook_off_without_a_secret(client, settings, finalized):
    settings.STRIPE_WEBHOOK_SECRET = ""
    payload = event(finalized)
    assert post(client, payload, sign(payload)).status_code == 503
    assert StripeEvent.objects.count() == 0


def test_only_post(client):
    assert client.get(reverse("billing:stripe-webhook")).status_code == 405
