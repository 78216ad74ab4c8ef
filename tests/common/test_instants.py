"""common.instants: the one reading of ISO instants and months for the exports, the audit log and billing."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from common.instants import parse_instant, parse_month


def test_a_date_is_its_midnight_in_utc_and_a_naive_datetime_is_utc():
    assert parse_instant("2026-11-01") == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_instant("2026-11-01T12:30:00") == datetime(2026, 11, 1, 12, 30, tzinfo=UTC)
    assert parse_instant("2026-11-01 12:30") == datetime(2026, 11, 1, 12, 30, tzinfo=UTC)


def test_an_offset_is_kept():
    value = parse_instant("2026-11-01T12:00:00+02:00")
    assert value.utcoffset() == timedelta(hours=2) and value == datetime(2026, 11, 1, 10, tzinfo=UTC)


@pytest.mark.parametrize("raw", ["", "yesterday", "2026-13-01", "2026-11-01\x00", "2026-11-01T25:00"])
def test_anything_else_is_a_value_error(raw):
    with pytest.raises(ValueError):
        parse_instant(raw)


def test_a_month_is_its_first_day():
    assert parse_month("2026-02") == date(2026, 2, 1)
    for raw in ("2026-2-01", "2026-13", "2026", "2026-02-01", "2026-02\x00"):
        with pytest.raises(ValueError):
            parse_month(raw)
