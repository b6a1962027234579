"""Timestamps as ctxd writes them: UTC, ISO 8601, millisecond precision, ``Z``."""

from __future__ import annotations

from datetime import UTC, datetime


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    """Parse an ISO 8601 timestamp (``Z`` accepted); naive values are taken as UTC."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)
