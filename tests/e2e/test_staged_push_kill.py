"""A large push on SQLite is written in several transactions (``service/ingest.py``,
staged pushes). A daemon SIGKILLed between them acknowledged nothing, so nothing of the
push may show: ``ctxd-cli doctor`` finds the file sound (the rows are marked as an
unfinished push), the restarted daemon removes them, the session is as it was, and the
same push sent again (same idempotency keys) is stored, not taken for a duplicate."""

from __future__ import annotations

import asyncio

from ctxd.client import Client
from ctxd.doctor.check import check
from tests.e2e.helpers import count_now, db_rows, kill_while_staged

MB = 1024 * 1024


async def connect(daemon) -> Client:
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="staged-kill")
    return client


def _staged_rows(db: str) -> int:
    """Rows above the session's last_seq (a staged push's, not yet part of it)."""
    return count_now(db, "SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id "
                         "WHERE m.seq > s.last_seq")


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
    await kill_while_staged(daemon, client, push, lambda: _staged_rows(db), "push")

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
