"""Timestamps as ctxd writes them: UTC, ISO 8601, millisecond precision, ``Z``."""

from __future__ import annotations

import time
from datetime import UTC, datetime

_second: tuple[int, str] = (-1, "")
"""The last whole second written, and its text up to the seconds."""


def now_iso() -> str:
    """``datetime.now(UTC).isoformat(timespec="milliseconds")`` with ``Z``, the date and
    time written once per second (every push stamps its messages: a quarter of the cost)."""
    global _second
    ms = time.time_ns() // 1_000_000
    second, milli = divmod(ms, 1000)
    written = _second  # (read once: threads call this too)
    if written[0] != second:
        written = _second = (second, datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds")[:-6])
    return f"{written[1]}.{milli:03d}Z"


def parse_iso(text: str) -> datetime:
    """Parse an ISO 8601 timestamp (``Z`` accepted); naive values are taken as UTC."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)
