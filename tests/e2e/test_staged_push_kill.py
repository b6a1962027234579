"""A large push on SQLite is written in several transactions (``service/ingest.py``,
staged pushes). A daemon SIGKILLed between them acknowledged nothing, so nothing of the
push may show: ``ctxd-cli doctor`` finds the file sound (the rows are marked as an
unfinished push), the restarted daemon removes them, the session is as it was, and the
same push sent again (same idempotency keys) is stored, not taken for a duplicate."""

from __future__ import annotations

import asyncio
import sqlite3
import time

from ctxd.client import Client
from ctxd.doctor.check import check
from tests.e2e.helpers import db_rows

MB = 1024 * 1024


async def connect(daemon) -> Client:
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="staged-kill")
    return client


def _staged_rows(db: str) -> int:
    """Rows above the session's last_seq (a staged push's, not yet part of it)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return conn.execute("SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id "
                            "WHERE m.seq > s.last_seq").fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


async def test_sigkill_between_the_transactions_of_a_large_push(daemon_factory):
    daemon = daemon_factory(name="k")
    db = str(daemon.data_dir / "ctxd.db")
    client = await connect(daemon)
    await client.request("session/create", {"sessionId": "s", "contextWindow": 100_000_000,
                                            "settings": {"autoCompress": False}})
    before = await client.request("session/push", {"sessionId": "s", "messages": [
        {"role": "user", "content": f"small {i}"} for i in range(3)]})
    big = [{"role": "user", "content": f"big {i} " + "lorem ipsum " * (MB // 12), "idempotencyKey": f"big-{i}"}
           for i in range(48)]  # 48 MB: 24 transactions of 2 MB
    push = asyncio.create_task(client.request("session/push", {"sessionId": "s", "messages": big}))
    deadline = time.monotonic() + 120
    while not _staged_rows(db):
        assert not push.done(), "the push finished before a transaction of it was seen (too fast to kill)"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.002)
    daemon.kill()
    try:
        await push
    except BaseException:  # noqa: BLE001 - the connection went away with the daemon
        pass
    else:
        raise AssertionError("the push was acknowledged although the daemon was killed before it finished")
    await client.close(shutdown=False)

    report = check(db)
    assert report.ok, report.problems
    assert any("unfinished push" in note for note in report.notes), report.notes

    daemon.start()
    client = await connect(daemon)
    try:
        assert _staged_rows(db) == 0
        info = await client.request("session/get", {"sessionId": "s"})
        assert (info["messageCount"], info["lastSeq"]) == (3, 3)
        assert info["tokenCount"] == before["tokenCount"]
        assert [seq for seq, _, _ in db_rows(daemon.data_dir, "s")] == [1, 2, 3]
        again = await client.request("session/push", {"sessionId": "s", "messages": big})
        assert [m["seq"] for m in again["messages"]] == list(range(4, 52))
        assert not any(m.get("duplicate") for m in again["messages"])
        history = await client.request("session/history", {"sessionId": "s", "limit": 100})
        assert [m["seq"] for m in history["messages"]] == list(range(1, 52))
    finally:
        await client.close()
    report = check(db)
    assert report.ok and not any("unfinished" in note for note in report.notes), (report.problems, report.notes)
