"""Retention over the protocol, against a real daemon (auto-cleanup).

* ``sessions.max_sessions``: creating (or importing) a session beyond the limit deletes
  exactly the least recently active ones (activity = the last push; reading, updating
  or snapshotting a session is not activity), with their snapshots and everything else
  they own (checked in the SQLite file after the daemon stopped), announcing each with
  ``session/deleted``; a restart with a lower limit applies it.
* ``session/cleanup {keep}`` and ``session/clear {all}``.
* Rolling snapshot cleanup: ``snapshots.keep`` automatic snapshots per session, the
  newest; manual snapshots stay.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.compression_helpers import Conn, Driver
from tests.e2e.history_helpers import chat_turns, flatten, index_settled, push, read_db, rpc_error, running

pytestmark = pytest.mark.usefixtures("storage_backend")

OWNED_TABLES = ("messages", "snapshots", "checkpoints", "compressions", "session_events")


async def tick() -> None:
    """ctxd records activity to the millisecond: keep consecutive steps apart."""
    await asyncio.sleep(0.005)


async def listed(conn: Conn) -> list[str]:
    return [s["sessionId"] for s in (await conn.call("session/list", {}))["sessions"]]


def deleted_notes(conn: Conn, since: int) -> list[str]:
    return [p["sessionId"] for p in conn.of("session/deleted", since)]


async def test_max_sessions_deletes_the_least_recently_active_with_their_snapshots():
    async with running("sessions.max_sessions=3") as d:
        conn = await d.connect("*")
        for sid in ("s1", "s2", "s3"):
            await conn.call("session/create", {"sessionId": sid})
            await tick()
        for sid in ("s2", "s1", "s3"):  # activity, oldest first: s2, s1, s3
            await push(conn, sid, flatten(chat_turns(1, 6, tag=sid)))
            await conn.call("snapshot/create", {"sessionId": sid, "label": f"{sid} manual"})
            await tick()
        # Not activity: reading, snapshotting, restoring, changing the title of s2.
        snap = await conn.call("snapshot/create", {"sessionId": "s2"})
        await conn.call("snapshot/restore", {"sessionId": "s2", "snapshotId": snap["snapshotId"]})
        await conn.call("session/update", {"sessionId": "s2", "title": "renamed"})
        await conn.call("session/get", {"sessionId": "s2"})
        await conn.call("session/history", {"sessionId": "s2"})
        await tick()
        assert await listed(conn) == ["s3", "s1", "s2"]
        assert len((await conn.call("snapshot/list", {"sessionId": "s2"}))["snapshots"]) == 3

        mark = conn.mark()
        await conn.call("session/create", {"sessionId": "s4"})
        await tick()
        await conn.wait_note(lambda m, p: m == "session/deleted", since=mark)
        assert deleted_notes(conn, mark) == ["s2"]
        assert await listed(conn) == ["s4", "s3", "s1"]
        await rpc_error(conn, "snapshot/list", {"sessionId": "s2"}, -33001)
        await rpc_error(conn, "snapshot/get", {"sessionId": "s2", "snapshotId": snap["snapshotId"]}, -33001)
        await rpc_error(conn, "session/history", {"sessionId": "s2"}, -33001)

        await push(conn, "s1", [{"role": "user", "content": "still here"}])  # s1 is now the most recent
        await tick()
        mark = conn.mark()
        await conn.call("session/create", {"sessionId": "s5"})
        await tick()
        await conn.wait_note(lambda m, p: m == "session/deleted", since=mark)
        assert deleted_notes(conn, mark) == ["s3"]
        assert await listed(conn) == ["s5", "s1", "s4"]
        await rpc_error(conn, "snapshot/list", {"sessionId": "s3"}, -33001)

        # Import counts as creating: the least recently active (s4, created before s1's push) goes.
        document = (await conn.call("session/export", {"sessionId": "s1", "format": "json"}))["document"]
        mark = conn.mark()
        imported = await conn.call("session/import", {"document": document, "sessionId": "s6"})
        await conn.wait_note(lambda m, p: m == "session/deleted", since=mark)
        assert imported["sessionIds"] == ["s6"]
        assert deleted_notes(conn, mark) == ["s4"]
        assert set(await listed(conn)) == {"s6", "s5", "s1"}
        await index_settled(d.db_path)  # every message indexed: the index rows are checked below
        surviving = {s: len((await conn.call("snapshot/list", {"sessionId": s}))["snapshots"]) for s in ("s1", "s5")}
        assert surviving == {"s1": 1, "s5": 0}
        await d.stop()

        db = d.db_path
        assert sorted(r[0] for r in read_db(db, "SELECT id FROM sessions")) == ["s1", "s5", "s6"]
        for table in OWNED_TABLES:
            rows = read_db(db, f"SELECT count(*) FROM {table} WHERE session_id IN ('s2', 's3', 's4')")
            assert rows == [(0,)], f"{table} still holds rows of deleted sessions"
        # (s6 is s1 exported and imported: its snapshot came with it.)
        assert read_db(db, "SELECT session_id, count(*) FROM snapshots GROUP BY session_id ORDER BY 1") == \
            [("s1", 1), ("s6", 1)]
        messages = read_db(db, "SELECT count(*) FROM messages")[0][0]
        assert read_db(db, "SELECT count(*) FROM messages_fts")[0][0] == messages

        # A restart with a lower limit applies it at startup.
        d.proc.sets = ["sessions.max_sessions=2"]
        d.proc.start()
        conn = await d.connect()
        assert await listed(conn) == ["s6", "s5"]
        await d.stop()
        assert read_db(db, "SELECT session_id, count(*) FROM snapshots GROUP BY session_id") == [("s6", 1)]


async def test_max_sessions_zero_keeps_everything():
    async with running("sessions.max_sessions=0") as d:
        conn = await d.connect("*")
        for i in range(5):
            await conn.call("session/create", {"sessionId": f"k{i}"})
        assert len(await listed(conn)) == 5 and not conn.of("session/deleted")


async def test_cleanup_keeps_exactly_the_most_recent():
    async with running() as d:
        conn = await d.connect("*")
        for sid in ("c0", "c1", "c2", "c3", "c4", "c5"):
            await conn.call("session/create", {"sessionId": sid})
        for sid in ("c3", "c0", "c5", "c1", "c4", "c2"):  # activity, oldest first
            await push(conn, sid, [{"role": "user", "content": f"hello from {sid}"}])
            await tick()
        await conn.call("snapshot/create", {"sessionId": "c3"})
        assert await listed(conn) == ["c2", "c4", "c1", "c5", "c0", "c3"]

        await rpc_error(conn, "session/cleanup", {"keep": -1}, -32602)
        await rpc_error(conn, "session/cleanup", {}, -32602)
        await rpc_error(conn, "session/cleanup", {"keep": "2"}, -32602)
        assert (await conn.call("session/cleanup", {"keep": 6}))["deleted"] == []
        assert (await conn.call("session/cleanup", {"keep": 100}))["deleted"] == []
        assert len(await listed(conn)) == 6 and not conn.of("session/deleted")

        mark = conn.mark()
        result = await conn.call("session/cleanup", {"keep": 2})
        assert sorted(result["deleted"]) == ["c0", "c1", "c3", "c5"]
        await conn.wait_note(lambda m, p: m == "session/deleted" and p["sessionId"] == result["deleted"][-1],
                             since=mark)
        assert sorted(deleted_notes(conn, mark)) == ["c0", "c1", "c3", "c5"]
        assert await listed(conn) == ["c2", "c4"]
        for sid in result["deleted"]:
            await rpc_error(conn, "session/get", {"sessionId": sid}, -33001)
        assert (await conn.call("session/cleanup", {"keep": 2}))["deleted"] == []

        # clear: only with all=true.
        for params in ({"all": False}, {}, {"all": "yes"}):
            await rpc_error(conn, "session/clear", params, -32602)
        assert await listed(conn) == ["c2", "c4"]
        mark = conn.mark()
        cleared = await conn.call("session/clear", {"all": True})
        assert sorted(cleared["deleted"]) == ["c2", "c4"]
        await conn.wait_note(lambda m, p: m == "session/deleted" and p["sessionId"] == cleared["deleted"][-1],
                             since=mark)
        assert sorted(deleted_notes(conn, mark)) == ["c2", "c4"]
        assert await listed(conn) == []
        assert (await conn.call("daemon/status"))["sessions"] == 0
        assert (await conn.call("session/clear", {"all": True}))["deleted"] == []
        await d.stop()
        for table in ("sessions", *OWNED_TABLES):
            assert read_db(d.db_path, f"SELECT count(*) FROM {table}") == [(0,)], table


async def test_rolling_cleanup_keeps_the_newest_automatic_snapshots_and_every_manual_one():
    keep = 2
    async with running(f"snapshots.keep={keep}") as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "r", "contextWindow": 2048})
        drive = Driver(conn, "r")
        turns = chat_turns(90, 400, tag="r")
        manual = []
        for n, turn in enumerate(turns):
            await drive.push(turn.messages)
            if n in (1, 3, 5):
                manual.append((await conn.call("snapshot/create", {"sessionId": "r", "label": f"m{n}"}))["snapshotId"])
            autos = [p["snapshot"]["snapshotId"] for p in conn.of("snapshot/created")
                     if p["snapshot"]["trigger"] == "auto"]
            if len(autos) >= keep + 4:
                break
        else:
            raise AssertionError("too few automatic snapshots")
        listed_now = (await conn.call("snapshot/list", {"sessionId": "r"}))["snapshots"]
        by_trigger: dict[str, list[str]] = {}
        for s in listed_now:
            by_trigger.setdefault(s["trigger"], []).append(s["snapshotId"])
        assert sorted(by_trigger["manual"]) == sorted(manual)
        assert by_trigger["auto"] == list(reversed(autos[-keep:]))  # newest first
        rolled: list[str] = []
        for p in conn.of("snapshot/deleted"):
            assert p["reason"] == "rolling" and p["sessionId"] == "r"
            rolled += p["snapshotIds"]
        assert sorted(rolled) == sorted(autos[:-keep])
        assert not set(rolled) & set(manual)
        for sid in autos[:-keep]:
            await rpc_error(conn, "snapshot/get", {"sessionId": "r", "snapshotId": sid}, -33020)
        await d.stop()
        rows = read_db(d.db_path, "SELECT trigger_kind, count(*) FROM snapshots GROUP BY trigger_kind ORDER BY 1")
        assert rows == [("auto", keep), ("manual", len(manual))]
