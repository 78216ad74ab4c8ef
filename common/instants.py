"""Instants and months as callers write them (query strings, command flags), read one way everywhere: the
billing exports, the audit log's API and export command, the billing commands and tasks."""

from __future__ import annotations

from datetime import UTC, date, datetime


def parse_instant(raw: str) -> datetime:
    """An ISO date (midnight) or datetime, naive meaning UTC; ValueError for anything else (a NUL included)."""
    value = datetime.fromisoformat(raw)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_month(raw: str) -> date:
    """'YYYY-MM' -> the month's first day; ValueError for anything else."""
    return date.fromisoformat(f"{raw}-01")
