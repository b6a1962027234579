"""A large import on SQLite is written in several transactions (``service/transfer.py``):
its session first, hidden and with no messages, then its rows. A daemon SIGKILLed between
them acknowledged nothing, so nothing of the import may show: ``ctxd-cli doctor`` finds
the file sound (the session and its rows are marked as unfinished), the restarted daemon
removes them, no reader finds the session, and the same import sent again is stored."""

from __future__ import annotations

import asyncio
import json

from ctxd.client import Client, RpcError
from ctxd.doctor.check import check
from tests.e2e.helpers import count_now, db_rows, kill_while_staged

MB = 1024 * 1024
SID = "imported"


async def connect(daemon) -> Client:
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="staged-import-kill")
    return client


def _staged_rows(db: str) -> int:
    """Rows of the import written so far (none is part of a history before its end)."""
    return count_now(db, "SELECT count(*) FROM messages WHERE session_id = ?", (SID,))


def document() -> str:
    """48 messages of 1 MB: 24 staged transactions of 2 MB."""
    messages = [{"seq": i + 1, "createdAt": "2025-01-01T00:00:00Z",
                 "message": {"role": "user" if i % 2 == 0 else "assistant",
                             "content": f"big {i} " + "lorem ipsum " * (MB // 12)}} for i in range(48)]
    return json.dumps({"format": "ctxd.session", "version": 1, "exportedAt": "2025-01-01T00:00:00Z",
                       "session": {"sessionId": SID, "createdAt": "2025-01-01T00:00:00Z", "model": "gpt-4o",
                                   "contextWindow": 100_000_000, "settings": {"autoCompress": False}},
                       "messages": messages, "checkpoints": [], "compressions": [], "events": []})


async def _not_found(client: Client, method: str, params: dict) -> bool:
    try:
        await client.request(method, params)
    except RpcError as exc:
        assert exc.code == -33001, exc
        return True
    return False


async def test_sigkill_between_the_transactions_of_a_large_import(daemon_factory):
    daemon = daemon_factory(name="k")
    db = str(daemon.data_dir / "ctxd.db")
    client = await connect(daemon)
    await client.request("session/create", {"sessionId": "s", "settings": {"autoCompress": False}})
    await client.request("session/push", {"sessionId": "s", "messages": [
        {"role": "user", "content": f"small {i}"} for i in range(3)]})
    doc = document()
    importing = asyncio.create_task(client.request("session/import", {"document": doc, "format": "json"}))

    async def unseen() -> None:  # between two of its transactions, no reader finds the session
        listed = await client.request("session/list", {})
        assert [s["sessionId"] for s in listed["sessions"]] == ["s"]
        assert await _not_found(client, "session/get", {"sessionId": SID})

    await kill_while_staged(daemon, client, importing, lambda: _staged_rows(db), "import", unseen)

    daemon.start()
    client = await connect(daemon)
    try:
        assert _staged_rows(db) == 0
        assert db_rows(daemon.data_dir, SID) == []
        listed = await client.request("session/list", {})
        assert [s["sessionId"] for s in listed["sessions"]] == ["s"]
        assert await _not_found(client, "session/get", {"sessionId": SID})
        assert await _not_found(client, "session/history", {"sessionId": SID})
        info = await client.request("session/get", {"sessionId": "s"})
        assert (info["messageCount"], info["lastSeq"]) == (3, 3)
        again = await client.request("session/import", {"document": doc, "format": "json"})
        assert again["sessionIds"] == [SID] and again["messageCount"] == 48
        history = await client.request("session/history", {"sessionId": SID, "limit": 100})
        assert [m["seq"] for m in history["messages"]] == list(range(1, 49))
    finally:
        await client.close()
    report = check(db)
    assert report.ok and not any("unfinished" in note for note in report.notes), (report.problems, report.notes)
