"""Rates, spans and the hourly rebuild against the database: every request costed once, every
replica-hour's attributed cost + idle = up hours x rate to the cent, unrated classes flagged at zero."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from tests.billing.cost_fixtures import rate, ready_replica, span

H = datetime(2026, 11, 10, 12, tzinfo=UTC)


@pytest.fixture
def hours():
    from billing.models import ReplicaHourCost, RequestCost

    return ReplicaHourCost, RequestCost


def _usage(make_event, ingest, *, at, url="http://w1:8000", **fields):
    return ingest(make_event(created_at=at, worker_url=url, **fields))


def test_rate_create_closes_the_open_rate_refuses_overlaps_and_is_audited(db):
    from billing.errors import BillingError
    from billing.models import WorkerClassRate
    from controlplane.audit.models import AuditEvent

    first = rate(start=H)
    second = rate(hourly="4", start=H + timedelta(days=1))
    first.refresh_from_db()
    assert first.effective_to == second.effective_from
    assert list(AuditEvent.objects.filter(action__startswith="worker_rate.").values_list("action", flat=True)
                .order_by("id")) == ["worker_rate.create", "worker_rate.close", "worker_rate.create"]
    with pytest.raises(BillingError, match="overlaps"):
        rate(start=H + timedelta(hours=1), end=H + timedelta(hours=2))
    for bad in (dict(start=H + timedelta(days=3, minutes=30)), dict(hourly="-1", start=H + timedelta(days=4)),
                dict(decode="0", start=H + timedelta(days=4)), dict(worker_class="", start=H + timedelta(days=4)),
                dict(worker_class="a\x00b", start=H + timedelta(days=4)), dict(hourly="NaN", start=H + timedelta(days=4)),
                dict(currency="jpy", start=H + timedelta(days=4)), dict(hourly="1e-11", start=H + timedelta(days=4)),
                dict(start=datetime(2026, 12, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))))):  # 18:30 UTC
        with pytest.raises(BillingError):
            rate(**bad)
    assert WorkerClassRate.objects.count() == 2


def test_spans_follow_ready_replicas_and_a_new_ready_at_opens_a_new_span(db):
    from billing.models import ReplicaSpan
    from billing.services import replica_spans_observe

    replica = ready_replica(labels={"worker_class": "h100-llama"}, ready_at=H)
    ready_replica(accelerator="L40S", ready_at=H)
    assert replica_spans_observe(now=H + timedelta(minutes=1)) == 2
    assert replica_spans_observe(now=H + timedelta(minutes=2)) == 2
    assert sorted(ReplicaSpan.objects.values_list("worker_class", flat=True)) == ["L40S", "h100-llama"]
    assert set(ReplicaSpan.objects.values_list("last_seen_at", flat=True)) == {H + timedelta(minutes=2)}
    replica.ready_at = H + timedelta(minutes=5)  # failed and came back: a new span
    replica.save()
    replica_spans_observe(now=H + timedelta(minutes=6))
    assert ReplicaSpan.objects.filter(replica_uid=replica.uid).count() == 2


def test_an_hour_splits_between_requests_and_idle_exactly(db, make_event, ingest, hours):
    ReplicaHourCost, RequestCost = hours
    rate(start=H - timedelta(days=1), hourly="3.60")
    span(started_at=H - timedelta(hours=1), last_seen_at=H + timedelta(minutes=30))  # up 30 min of this hour
    a = _usage(make_event, ingest, at=H + timedelta(minutes=1), prompt_tokens=2200, cached_tokens=200,
               completion_tokens=100)  # 1 s prefill + 2 s decode
    b = _usage(make_event, ingest, at=H + timedelta(minutes=2), prompt_tokens=6000, cached_tokens=0,
               completion_tokens=0, embeddings=True)
    from billing.services import cost_hour_rebuild

    result = cost_hour_rebuild(hour=H)
    assert (result.replica_hours, result.requests, result.unattributed, result.unrated) == (1, 2, 0, 0)
    hour = ReplicaHourCost.objects.get()
    assert hour.total_cost == Decimal("1.80") and hour.up_seconds == Decimal(1800)
    assert hour.attributed_cost + hour.idle_cost == hour.total_cost
    assert hour.attributed_cost == Decimal("0.006") and hour.busy_seconds == Decimal(6)
    costs = {c.usage_id: c for c in RequestCost.objects.all()}
    assert costs[a.pk].cost == costs[b.pk].cost == Decimal("0.003")
    assert costs[b.pk].kind == "embeddings" and costs[a.pk].kind == "online"
    assert costs[a.pk].tenant_id == a.tenant_id and costs[a.pk].deployment == "llama"
    assert costs[a.pk].worker_class == "H100" and costs[a.pk].tier == "standard"


def test_rebuild_is_idempotent_and_folds_in_late_usage(db, make_event, ingest, hours):
    ReplicaHourCost, RequestCost = hours
    from billing.services import cost_hour_rebuild

    rate(start=H - timedelta(days=1))
    span(started_at=H, last_seen_at=H + timedelta(hours=2))
    _usage(make_event, ingest, at=H + timedelta(minutes=10))
    cost_hour_rebuild(hour=H)
    cost_hour_rebuild(hour=H)
    assert ReplicaHourCost.objects.count() == 1 and RequestCost.objects.count() == 1
    _usage(make_event, ingest, at=H + timedelta(minutes=20))  # replayed from a spool after an outage
    ingest(make_event(request_id=RequestCost.objects.get().usage.request_id, created_at=H + timedelta(minutes=10),
                      worker_url="http://w1:8000"))  # and a duplicate, which the ledger keeps once
    cost_hour_rebuild(hour=H)
    hour = ReplicaHourCost.objects.get()
    assert RequestCost.objects.count() == 2 and hour.requests == 2
    assert hour.total_cost == Decimal("3.60") and hour.attributed_cost + hour.idle_cost == hour.total_cost


def test_an_hour_without_traffic_is_all_idle(db, hours):
    ReplicaHourCost, _ = hours
    from billing.services import cost_hour_rebuild

    rate(start=H - timedelta(days=1), hourly="2.50")
    span(started_at=H - timedelta(hours=5), last_seen_at=H + timedelta(hours=5))
    cost_hour_rebuild(hour=H)
    hour = ReplicaHourCost.objects.get()
    assert (hour.total_cost, hour.attributed_cost, hour.idle_cost, hour.requests) == (
        Decimal("2.50"), 0, Decimal("2.50"), 0)


def test_a_class_without_a_rate_costs_zero_and_is_flagged(db, make_event, ingest, hours):
    ReplicaHourCost, RequestCost = hours
    from billing.services import cost_hour_rebuild

    span(started_at=H, last_seen_at=H + timedelta(hours=1), worker_class="mystery")
    _usage(make_event, ingest, at=H + timedelta(minutes=5))
    result = cost_hour_rebuild(hour=H)
    hour = ReplicaHourCost.objects.get()
    assert result.unrated == 1 and hour.unrated and hour.rate is None and hour.total_cost == 0
    assert RequestCost.objects.get().cost == 0


def test_usage_without_a_known_replica_is_counted_unattributed(db, make_event, ingest, hours):
    _, RequestCost = hours
    from billing.services import cost_hour_rebuild

    rate(start=H - timedelta(days=1))
    span(started_at=H + timedelta(minutes=30), last_seen_at=H + timedelta(hours=1))
    _usage(make_event, ingest, at=H + timedelta(minutes=5))  # before its worker's first span
    _usage(make_event, ingest, at=H + timedelta(minutes=6), url="http://elsewhere:8000")
    _usage(make_event, ingest, at=H + timedelta(minutes=7), url="")  # older gateways named no worker
    assert cost_hour_rebuild(hour=H).unattributed == 3
    assert RequestCost.objects.count() == 0


def test_a_request_goes_to_the_replica_its_worker_ran_then(db, make_event, ingest, hours):
    _, RequestCost = hours
    from billing.services import cost_hour_rebuild

    rate(start=H - timedelta(days=1))
    rate(worker_class="L40S", hourly="1", start=H - timedelta(days=1))
    span(started_at=H - timedelta(hours=1), last_seen_at=H + timedelta(minutes=20), deployment="old")
    span(started_at=H + timedelta(minutes=25), last_seen_at=H + timedelta(hours=2), deployment="new",
         worker_class="L40S")
    early = _usage(make_event, ingest, at=H + timedelta(minutes=10))
    late = _usage(make_event, ingest, at=H + timedelta(minutes=40))
    cost_hour_rebuild(hour=H)
    assert RequestCost.objects.get(usage=early).deployment == "old"
    assert RequestCost.objects.get(usage=late).worker_class == "L40S"


def test_the_rate_in_force_at_the_hour_applies(db, hours):
    ReplicaHourCost, _ = hours
    from billing.services import cost_hours_rebuild

    rate(start=H - timedelta(days=1), hourly="1")
    rate(start=H + timedelta(hours=1), hourly="2")
    span(started_at=H, last_seen_at=H + timedelta(hours=2))
    cost_hours_rebuild(start=H, end=H + timedelta(hours=2))
    assert list(ReplicaHourCost.objects.order_by("hour").values_list("total_cost", flat=True)) == [
        Decimal("1.00"), Decimal("2.00")]


def test_a_rebuild_refuses_an_hour_that_is_not_one(db):
    from billing.errors import BillingError
    from billing.services import cost_hour_rebuild

    with pytest.raises(BillingError):
        cost_hour_rebuild(hour=H + timedelta(minutes=1))
    with pytest.raises(BillingError):
        cost_hour_rebuild(hour=H.replace(tzinfo=None))
