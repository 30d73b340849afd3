"""The time stamped on what spectune records, made one way everywhere."""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["utc_timestamp"]


def utc_timestamp() -> str:
    """Now in UTC, ISO 8601 to the second (``2026-12-01T09:17:37+00:00``): every record's timestamp."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
