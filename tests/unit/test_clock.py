"""ctxd's timestamps: what ``datetime`` writes, to the millisecond, however often asked."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from ctxd.service.clock import now_iso, parse_iso


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_now_iso_is_the_time_as_datetime_writes_it() -> None:
    """Written between two readings of the clock, in ISO 8601 with milliseconds and ``Z``,
    over many calls in a row (the date and time up to the second are reused between them)."""
    for _ in range(20_000):
        before = _iso(datetime.now(UTC))
        now = now_iso()
        after = _iso(datetime.now(UTC))
        assert before <= now <= after
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", now), now
    assert abs((parse_iso(now_iso()) - datetime.now(UTC)).total_seconds()) < 5


def test_now_iso_moves_on_with_each_second(monkeypatch) -> None:
    """Across second, day and year boundaries, and back (a clock set back)."""
    from types import SimpleNamespace

    from ctxd.service import clock

    moments = [1_798_761_599_998, 1_798_761_599_999, 1_798_761_600_000, 1_798_761_600_001,
               1_798_761_601_000, 1_798_761_599_500, 86_399_999, 0]  # (ms since the epoch)
    for ms in moments:
        monkeypatch.setattr(clock, "time", SimpleNamespace(time_ns=lambda ms=ms: ms * 1_000_000 + 999_999))
        want = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
        assert now_iso() == _iso(want), ms
