"""Staged imports (``service/transfer.py``): on SQLite a large ``session/import`` writes its
session first, hidden and with no messages, then its rows in several short transactions
(as a large push does, ``store/messages.py``, "Staged pushes"), and a last one gives the
session its history and shows it. No reader sees any of it before that; an import that
fails, or a daemon killed meanwhile, leaves nothing; and what is stored is exactly what
one transaction stores.

``STAGE_CHUNK_ROWS`` is lowered here so that a few messages make several transactions;
the sizes do not matter to the mechanism."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxd.doctor.check import check
from ctxd.doctor.recover import recover
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.service import history, ingest, prompt, sessions, transfer
from ctxd.service.core import Service
from ctxd.store import sessions as session_store

from .service_helpers import chat, params
from .staged_helpers import failing_stages, hook_chunks, restarted, snapshot, written_jobs

SID = "imported"
OTHER = "other"
WORD = "zanzibarquux"


@pytest.fixture
def storage_url() -> str:
    return ""  # staging is SQLite's (PostgreSQL keeps one transaction, on its second writer)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_CHUNK_ROWS", 2)


def document(n: int, sid: str = SID) -> str:
    """A ctxd JSON export of ``n`` messages: text, a tool call and its result, usage (the
    stats' drift), a goal, settings and descriptive fields."""
    messages: list[dict[str, Any]] = []
    for i in range(n):
        if i % 4 == 2:
            message: dict[str, Any] = {"role": "assistant", "content": f"{WORD} reading {i}", "toolCalls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}],
                "usage": {"inputTokens": 100 + i, "outputTokens": 7}}
        elif i % 4 == 3:
            message = {"role": "tool", "toolCallId": f"call_{i - 1}", "content": f"{WORD} file {i} " * 5}
        else:
            message = {"role": "user" if i % 4 == 0 else "assistant", "content": f"{WORD} message {i} " * 3}
        messages.append({"seq": i + 1, "createdAt": f"2025-01-01T00:00:{i % 60:02d}Z", "message": message})
    return json.dumps({
        "format": "ctxd.session", "version": 1, "exportedAt": "2025-01-02T00:00:00Z",
        "session": {"sessionId": sid, "createdAt": "2025-01-01T00:00:00Z", "model": "gpt-4o",
                    "contextWindow": 1_000_000, "systemPrompt": "Be brief.", "tags": ["a", "b"],
                    "metadata": {"from": "test"},
                    "goal": {"id": "g1", "description": "finish the port", "createdAt": "2025-01-01T00:00:00Z"},
                    "settings": {"autoCompress": False}},
        "messages": messages, "checkpoints": [], "compressions": [], "events": []})


async def _import(svc: Service, doc: str, sid: str | None = None) -> Any:
    extra = {} if sid is None else {"sessionId": sid}
    return await transfer.import_session(svc, params("session/import", document=doc, format="json", **extra))


async def _missing(call: Awaitable[Any]) -> bool:
    try:
        await call
    except CtxdError as exc:
        assert exc.code == ErrorCode.SessionNotFound, exc
        return True
    return False


async def _seen(svc: Service, sid: str = SID) -> dict[str, Any]:
    """What every reader says about the imported session."""
    listed = await sessions.list_sessions(svc, params("session/list"))
    hits = (await history.search(svc, params("session/search", query=WORD, limit=50))).hits
    return {
        "list": sid in [s.session_id for s in listed],
        "get": not await _missing(sessions.get_session(svc, sid)),
        "history": not await _missing(history.history(svc, params("session/history", sessionId=sid))),
        "prompt": not await _missing(prompt.prompt(svc, params("context/prompt", sessionId=sid))),
        "export": not await _missing(transfer.export(svc, params("session/export", sessionId=sid, format="json"))),
        "search": sorted(h.seq for h in hits if h.session_id == sid),
        "retention": sid in [v[0] for v in await svc.db.read(session_store.retention_victims, 1, None, set())],
    }


NOTHING = {"list": False, "get": False, "history": False, "prompt": False, "export": False, "search": [],
           "retention": False}



def _rows(path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _stored(path: Path, sid: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The session's row (but its id and last activity) and its message rows (but their ids)."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("SELECT * FROM sessions WHERE id = ?", (sid,)).fetchone()
        session = [tuple((k, row[k]) for k in row.keys() if k not in ("id", "last_activity"))]
        messages = [tuple((k, r[k]) for k in r.keys() if k not in ("id", "session_id"))
                    for r in conn.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
        return session, messages
    finally:
        conn.close()


async def test_a_large_import_is_invisible_until_its_last_commit(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    await sessions.create_session(service, params("session/create", sessionId=OTHER, model="gpt-4o"))
    assert await _seen(service) == NOTHING
    during: dict[str, Any] = {}

    async def look() -> None:
        await service.indexer.catch_up()  # (indexes the staged rows: search must still drop them)
        during.update(await _seen(service))
        # Another client's push goes through between the transactions.
        during["other"] = (await ingest.push(service, params("session/push", sessionId=OTHER,
                                                             messages=chat(0, 1)))).message_count
        during["doctor"] = check(service.config.database_path)

    chunks = hook_chunks(service, monkeypatch, 2, look)
    result = await _import(service, document(8))
    assert chunks == [2, 2, 2, 2]  # several transactions
    report = during.pop("doctor")
    assert report.ok, report.problems
    assert any("unfinished" in n for n in report.notes), report.notes
    assert during.pop("other") == 2
    assert during == NOTHING
    assert result.session_ids == [SID] and result.message_count == 8
    await service.indexer.catch_up()
    after = await _seen(service)
    assert after == {"list": True, "get": True, "history": True, "prompt": True, "export": True,
                     "search": list(range(1, 9)), "retention": True}  # (OTHER was pushed to since)
    page = await history.history(service, params("session/history", sessionId=SID, limit=100))
    assert [e.seq for e in page.messages] == list(range(1, 9))
    final = check(service.config.database_path)
    assert final.ok and not any("unfinished" in n for n in final.notes), (final.problems, final.notes)


async def test_a_staged_import_stores_what_one_transaction_stores(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = hook_chunks(service, monkeypatch, 0)
    staged = await _import(service, document(9), "staged")
    assert chunks == [2, 2, 2, 2, 1]
    monkeypatch.setattr(ingest, "STAGE_CHUNK_ROWS", 1000)
    whole = await _import(service, document(9), "whole")
    assert chunks == [2, 2, 2, 2, 1]  # (one transaction, as before)
    assert (staged.message_count, staged.format, staged.warnings) == (whole.message_count, whole.format,
                                                                      whole.warnings)
    path = service.config.database_path
    assert _stored(path, "staged") == _stored(path, "whole")
    infos = [msgspec.to_builtins(await sessions.get_session(service, sid)) for sid in ("staged", "whole")]
    for info in infos:
        info.pop("sessionId"), info.pop("lastActivity")
    assert infos[0] == infos[1]
    prompts = [await prompt.prompt(service, params("context/prompt", sessionId=sid)) for sid in ("staged", "whole")]
    assert msgspec.to_builtins(prompts[0]) == {**msgspec.to_builtins(prompts[1]), "sessionId": "staged"}


async def test_a_failed_import_leaves_nothing(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = failing_stages(service, monkeypatch, 3, cleanup_failures=0)
    path = service.config.database_path
    with pytest.raises(CtxdError, match="disk full"):
        await _import(service, document(8))
    assert _rows(path, "SELECT count(*) FROM sessions") == [(0,)]
    assert _rows(path, "SELECT count(*) FROM messages") == [(0,)]
    assert _rows(path, "SELECT count(*) FROM unfinished_pushes") == [(0,)]
    assert await _seen(service) == NOTHING
    # The same import again is stored.
    assert (await _import(service, document(8))).message_count == 8
    # One whose clean-up fails too stays hidden, and goes when the daemon next starts.
    calls.update(n=0, cleanup_failures=1)
    with pytest.raises(CtxdError, match="disk full"):
        await _import(service, document(8, "second"))
    assert _rows(path, "SELECT count(*) FROM messages WHERE session_id = 'second'") == [(4,)]
    assert await _seen(service, "second") == NOTHING
    assert check(path).ok
    await service.close()
    async with restarted(path) as svc:
        assert _rows(path, "SELECT id FROM sessions") == [(SID,)]
        assert _rows(path, "SELECT count(*) FROM messages WHERE session_id = 'second'") == [(0,)]
        assert (await _import(svc, document(8, "second"))).message_count == 8


async def test_a_kill_between_transactions_leaves_nothing(
        service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await sessions.create_session(service, params("session/create", sessionId=OTHER, model="gpt-4o"))
    await ingest.push(service, params("session/push", sessionId=OTHER, messages=chat(0, 1)))
    killed = tmp_path / "killed" / "ctxd.db"

    async def kill() -> None:
        snapshot(service.config.database_path, killed)

    hook_chunks(service, monkeypatch, 2, kill)
    await _import(service, document(8))

    # The file as the killed daemon left it: the session and 4 rows, marked, and not damage.
    report = check(killed)
    assert report.ok, report.problems
    assert any("unfinished" in n for n in report.notes), report.notes
    assert _rows(killed, "SELECT count(*) FROM messages WHERE session_id = ?", SID) == [(4,)]
    # A recovered copy leaves the import out.
    recovered = recover(killed)
    assert _rows(recovered.path, "SELECT id FROM sessions") == [(OTHER,)]
    assert _rows(recovered.path, "SELECT count(*) FROM messages WHERE session_id = ?", SID) == [(0,)]

    async with restarted(killed) as svc:  # removes it first
        assert _rows(killed, "SELECT id FROM sessions") == [(OTHER,)]
        assert _rows(killed, "SELECT count(*) FROM messages WHERE session_id = ?", SID) == [(0,)]
        assert _rows(killed, "SELECT count(*) FROM unfinished_pushes") == [(0,)]
        assert await _seen(svc) == NOTHING
        assert (await sessions.get_session(svc, OTHER)).message_count == 2
        again = await _import(svc, document(8))
        assert again.session_ids == [SID] and again.message_count == 8


async def test_an_import_over_an_existing_session_stages_nothing(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    await sessions.create_session(service, params("session/create", sessionId=OTHER, model="gpt-4o"))
    await ingest.push(service, params("session/push", sessionId=OTHER, messages=chat(0, 1)))
    chunks = hook_chunks(service, monkeypatch, 0)
    with pytest.raises(CtxdError) as caught:
        await _import(service, document(8), OTHER)
    assert caught.value.code == ErrorCode.SessionExists
    assert chunks == []
    path = service.config.database_path
    assert _rows(path, "SELECT count(*) FROM messages") == [(2,)]
    assert (await sessions.get_session(service, OTHER)).message_count == 2


async def test_a_small_import_takes_one_transaction(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_CHUNK_ROWS", 8)
    jobs = written_jobs(service, monkeypatch)
    assert (await _import(service, document(8))).message_count == 8
    assert [fn for fn in jobs if getattr(fn, "__module__", "") in (transfer.__name__, ingest.__name__)] == [
        transfer._import_job]
