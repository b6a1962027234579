"""Staged pushes (``service/ingest.py``, ``store/messages.py``): on SQLite a large push
writes its rows in several short transactions and a last one makes them part of the
session. No reader sees them before that; a daemon killed between the transactions
leaves the session as it was (and ``ctxd-cli doctor`` clean), and the next push works.

The thresholds are lowered here so that a few small messages are staged one per
transaction; the sizes do not matter to the mechanism."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ctxd.doctor.check import check
from ctxd.doctor.recover import recover
from ctxd.protocol.errors import CtxdError
from ctxd.service import history, ingest, sessions, transfer
from ctxd.service.core import Service
from ctxd.store import messages as message_store

from .service_helpers import chat, params
from .staged_helpers import failing_stages, hook_chunks, restarted, snapshot, written_jobs

SID = "big"
OTHER = "small"
WORD = "zanzibarquux"


@pytest.fixture
def storage_url() -> str:
    return ""  # staging is SQLite's (PostgreSQL keeps one transaction)


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_BYTES", 2000)
    monkeypatch.setattr(ingest, "STAGE_CHUNK_BYTES", 1000)


def big(n: int, tag: str = "", keys: bool = False) -> list[dict[str, Any]]:
    """``n`` messages of ~1.2 KB each (over the lowered chunk size: one per transaction)."""
    out = []
    for i in range(n):
        m: dict[str, Any] = {"role": "user" if i % 2 == 0 else "assistant",
                             "content": f"{WORD} {tag} part {i} " + "lorem ipsum dolor " * 64}
        if keys:
            m["idempotencyKey"] = f"k{tag}-{i}"
        out.append(m)
    return out


async def _create(svc: Service, sid: str) -> None:
    await sessions.create_session(svc, params("session/create", sessionId=sid, model="gpt-4o",
                                              contextWindow=1_000_000))


async def _push(svc: Service, messages: list[dict[str, Any]], sid: str = SID) -> Any:
    return await ingest.push(svc, params("session/push", sessionId=sid, messages=messages))


async def _seen(svc: Service) -> dict[str, Any]:
    """What every reader says about the session."""
    info = await sessions.get_session(svc, SID)
    page = await history.history(svc, params("session/history", sessionId=SID, limit=1000))
    hits = (await history.search(svc, params("session/search", query=WORD, limit=50))).hits
    exported = await transfer.export(svc, params("session/export", sessionId=SID, format="json"))
    return {"count": info.message_count, "tokens": info.token_count,
            "history": [e.seq for e in page.messages],
            "search": sorted((h.session_id, h.seq) for h in hits),
            "export": (exported.message_count, len(exported.document)),
            "stored": await svc.db.read(message_store.count_messages, SID)}



async def test_a_staged_push_is_invisible_until_its_last_commit(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    await _create(service, SID)
    await _create(service, OTHER)
    first = await _push(service, big(2, "a"))  # over the lowered threshold: staged too
    before = await _seen(service)
    assert before["count"] == 2 and len(before["search"]) == 2
    during: dict[str, Any] = {}

    async def look() -> None:
        await service.indexer.catch_up()  # (indexes the staged rows: search must still drop them)
        during.update(await _seen(service))
        # Another client's push to another session goes through between the transactions.
        during["other"] = (await _push(service, chat(0, 1), OTHER)).message_count
        during["doctor"] = check(service.config.database_path)

    chunks = hook_chunks(service, monkeypatch, 3, look)
    result = await _push(service, big(6, "b"))
    assert chunks == [1] * 6  # one message per transaction
    report = during.pop("doctor")
    assert report.ok, report.problems
    assert any("unfinished push" in n for n in report.notes), report.notes
    assert during.pop("other") == 2
    assert during == before
    after = await _seen(service)
    assert [m.seq for m in result.messages] == [3, 4, 5, 6, 7, 8]
    assert after["count"] == 8 and after["history"] == list(range(1, 9)) and after["stored"] == 8
    assert after["tokens"] == first.token_count + sum(m.tokens for m in result.messages)
    assert len(after["search"]) == 8
    final = check(service.config.database_path)
    assert final.ok and not any("unfinished" in n for n in final.notes)



async def test_a_kill_between_transactions_leaves_the_session_as_it_was(
        service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await _create(service, SID)
    await _push(service, chat(0, 2))
    killed = tmp_path / "killed" / "ctxd.db"

    async def kill() -> None:
        snapshot(service.config.database_path, killed)

    hook_chunks(service, monkeypatch, 2, kill)
    await _push(service, big(5, "k", keys=True))

    # The file as the killed daemon left it: the staged rows are there, marked, and not damage.
    report = check(killed)
    assert report.ok, report.problems
    assert any("unfinished push" in n for n in report.notes), report.notes
    raw = sqlite3.connect(killed)
    assert raw.execute("SELECT count(*) FROM messages WHERE session_id = ?", (SID,)).fetchone()[0] == 4 + 2
    raw.close()
    # A recovered copy leaves them out too (its totals come from the rows it holds).
    recovered = recover(killed)
    raw = sqlite3.connect(recovered.path)
    assert raw.execute("SELECT message_count, last_seq FROM sessions WHERE id = ?", (SID,)).fetchone() == (4, 4)
    assert raw.execute("SELECT count(*) FROM messages WHERE session_id = ?", (SID,)).fetchone()[0] == 4
    raw.close()
    assert any("unfinished push" in n for n in recovered.notes) and not recovered.sessions_recomputed

    async with restarted(killed) as svc:  # removes them before anything else
        raw = sqlite3.connect(killed)
        assert raw.execute("SELECT count(*) FROM messages WHERE session_id = ?", (SID,)).fetchone()[0] == 4
        assert raw.execute("SELECT count(*) FROM unfinished_pushes").fetchone()[0] == 0
        raw.close()
        info = await sessions.get_session(svc, SID)
        assert info.message_count == 4
        # The retried push is stored, not taken for a duplicate of the rows that were dropped.
        retried = await _push(svc, big(5, "k", keys=True))
        assert [m.seq for m in retried.messages] == [5, 6, 7, 8, 9]
        assert not any(m.duplicate for m in retried.messages)
        again = await _push(svc, big(5, "k", keys=True))
        assert all(m.duplicate for m in again.messages)
        page = await history.history(svc, params("session/history", sessionId=SID, limit=100))
        assert [e.seq for e in page.messages] == list(range(1, 10))


async def test_a_failed_staged_push_leaves_nothing_and_the_next_push_works(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    await _create(service, SID)
    await _push(service, chat(0, 1))
    calls = failing_stages(service, monkeypatch, 3, cleanup_failures=1)
    with pytest.raises(CtxdError, match="simulated"):
        await _push(service, big(4, "f", keys=True))
    # Its rows are still there (the clean-up failed too), above last_seq: nobody sees them.
    assert await service.db.read(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0]) == 4
    assert (await sessions.get_session(service, SID)).message_count == 2
    # A small push (one transaction) removes them first, then stores itself after the last seq.
    small = await _push(service, [{"role": "user", "content": "hello", "idempotencyKey": "kf-0"}])
    assert [(m.seq, m.duplicate) for m in small.messages] == [(3, False)]
    assert await service.db.read(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0]) == 3
    # And a failing staged push whose clean-up works leaves nothing at all.
    calls["n"] = 0
    with pytest.raises(CtxdError, match="simulated"):
        await _push(service, big(4, "g"))
    assert await service.db.read(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0]) == 3
    assert await service.db.read(lambda c: c.execute("SELECT count(*) FROM unfinished_pushes").fetchone()[0]) == 0
    ok = await _push(service, big(4, "h"))
    assert [m.seq for m in ok.messages] == [4, 5, 6, 7]
    assert check(service.config.database_path).ok


async def test_duplicates_in_a_staged_push_are_answered_as_in_one_transaction(service: Service) -> None:
    await _create(service, SID)
    first = await _push(service, big(4, "d", keys=True))
    batch = big(6, "d", keys=True)  # the first four are stored already
    batch.append(dict(batch[5]))  # and a key repeated within the batch
    result = await _push(service, batch)
    assert [(m.seq, m.duplicate) for m in result.messages] == [
        (1, True), (2, True), (3, True), (4, True), (5, False), (6, False), (6, True)]
    assert [m.tokens for m in result.messages[:4]] == [m.tokens for m in first.messages]
    all_dups = await _push(service, big(6, "d", keys=True))
    assert all(m.duplicate for m in all_dups.messages)
    assert (await sessions.get_session(service, SID)).message_count == 6


async def test_small_pushes_take_one_transaction(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_BYTES", 8 * 1024 * 1024)
    await _create(service, SID)
    jobs = written_jobs(service, monkeypatch)
    result = await _push(service, big(6, "s"))
    assert [m.seq for m in result.messages] == [1, 2, 3, 4, 5, 6]
    ours = [fn for fn in jobs if getattr(fn, "__module__", "") == ingest.__name__]
    assert ours in ([ingest._write_job], [ingest._write_job_pipelined])  # (one transaction either way)
