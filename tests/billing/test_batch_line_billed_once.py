"""A batch line is billed once by construction: its ledger identity is the line (batch and custom_id),
not the request id of the attempt that served it, and the database holds it unique."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from billing.models import UsageRecord

pytestmark = pytest.mark.django_db

LINE = "batch_0123456789abcdef01234567:5d41402abc4b2a76b9719d911017c592"


def test_a_second_attempt_of_a_billed_line_adds_no_row(price, make_event, ingest):
    first = ingest(make_event(batch_id="batch_0123456789abcdef01234567", batch_line=LINE))
    # The line sent again under a new request id (its answer could not be stored, its runner died):
    again = ingest(make_event(batch_id="batch_0123456789abcdef01234567", batch_line=LINE, completion_tokens=999))
    assert again.pk == first.pk and again.completion_tokens == 300
    assert UsageRecord.objects.filter(batch_line=LINE).count() == UsageRecord.objects.count() == 1


def test_an_attempt_that_served_nothing_writes_no_row_and_does_not_take_the_lines_place(price, make_event, ingest):
    batch = "batch_0123456789abcdef01234567"
    failed = make_event(batch_id=batch, batch_line=LINE, status="error", prompt_tokens=0, cached_tokens=0,
                        completion_tokens=0, http_status=502)
    assert ingest(failed) is None and not UsageRecord.objects.exists()
    served = ingest(make_event(batch_id=batch, batch_line=LINE))
    assert served.completion_tokens == 300 and UsageRecord.objects.get().request_id == served.request_id


def test_the_database_refuses_a_second_row_for_a_line(price, make_event, ingest):
    record = ingest(make_event(batch_id="batch_0123456789abcdef01234567", batch_line=LINE))
    record.pk, record.request_id = None, "req-another-attempt"
    with pytest.raises(IntegrityError), transaction.atomic():
        record.save()


def test_online_requests_are_not_bound_by_the_line_identity(price, make_event, ingest):
    for _ in range(3):
        ingest(make_event())
    assert UsageRecord.objects.filter(batch_line="").count() == 3
