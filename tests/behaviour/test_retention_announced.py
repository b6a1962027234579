"""Retention removes nothing unless asked to, and announces every removal (real daemons).

* By default (``sessions.max_sessions = 0``, ``sessions.max_age_days = 0``) every session
  is kept, however many there are.
* With a limit, each removal comes with ``session/deleted`` carrying the rule as its
  reason and a detail, an INFO log line, and a count in ``session/list``'s ``retention``
  (what ``ctxd-cli sessions list`` prints under its table); deleting on request is
  ``reason: "request"`` and not counted as retention.
* ``sessions.max_age_days`` removes sessions inactive that long (here at startup, after
  their last activity was moved back in the database file).
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import db_write
from tests.e2e.history_helpers import push, read_db, running

pytestmark = pytest.mark.usefixtures("storage_backend")


async def listed(conn) -> list[str]:
    return [s["sessionId"] for s in (await conn.call("session/list", {}))["sessions"]]


async def test_by_default_every_session_is_kept():
    async with running() as d:
        conn = await d.connect("*")
        for i in range(105):  # more than the old default limit of 100
            await conn.call("session/create", {"sessionId": f"k{i:03d}"})
        result = await conn.call("session/list", {})
        assert len(result["sessions"]) == 105 and not conn.of("session/deleted")
        assert result["retention"] == {"removed": 0, "byReason": {}, "lastRemovedAt": None, "maxSessions": 0,
                                       "maxAgeDays": 0}


async def test_a_limit_announces_each_removal():
    async with running("sessions.max_sessions=2", "daemon.log_level=info") as d:
        conn = await d.connect("*")
        for sid in ("s1", "s2"):
            await conn.call("session/create", {"sessionId": sid, "title": f"title of {sid}"})
            await push(conn, sid, [{"role": "user", "content": f"hello from {sid}"}])
        mark = conn.mark()
        await conn.call("session/create", {"sessionId": "s3"})
        _, note = await conn.wait_note(lambda m, p: m == "session/deleted", since=mark)
        assert note["sessionId"] == "s1" and note["reason"] == "max_sessions"
        assert "sessions.max_sessions = 2" in note["detail"] and "1 message)" in note["detail"]
        assert sorted(await listed(conn)) == ["s2", "s3"]
        assert "retention removed session 's1' (title of s1): sessions.max_sessions = 2" in d.proc.stderr_text()

        # Deleting on request is announced as such, and is not retention.
        mark = conn.mark()
        await conn.call("session/delete", {"sessionId": "s2"})
        _, note = await conn.wait_note(lambda m, p: m == "session/deleted", since=mark)
        assert note == {"sessionId": "s2", "reason": "request", "detail": None}
        retention = (await conn.call("session/list", {}))["retention"]
        assert retention["removed"] == 1 and retention["byReason"] == {"max_sessions": 1}
        assert retention["maxSessions"] == 2 and retention["lastRemovedAt"]
        await d.stop()
        rows = read_db(d.db_path, "SELECT session_id, reason, detail, title, message_count FROM retention_removals")
        assert rows == [("s1", "max_sessions", "sessions.max_sessions = 2", "title of s1", 1)]


async def test_an_age_limit_removes_inactive_sessions_at_startup():
    async with running() as d:
        conn = await d.connect()
        for sid in ("old", "new"):
            await conn.call("session/create", {"sessionId": sid})
            await push(conn, sid, [{"role": "user", "content": f"hello from {sid}"}])
        await d.stop()
        db_write(d.proc.data_dir, "UPDATE sessions SET last_activity = '2020-01-01T00:00:00.000Z' WHERE id = 'old'")

        d.proc.sets = ["sessions.max_age_days=30", "daemon.log_level=info"]
        d.proc.start()
        conn = await d.connect()
        result = await conn.call("session/list", {})
        assert [s["sessionId"] for s in result["sessions"]] == ["new"]
        assert result["retention"]["byReason"] == {"max_age": 1} and result["retention"]["maxAgeDays"] == 30
        log = d.proc.stderr_text()
        assert "retention removed session 'old'" in log and "sessions.max_age_days = 30" in log
        assert "last activity 2020-01-01T00:00:00.000Z" in log
