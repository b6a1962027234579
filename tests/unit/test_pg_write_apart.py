"""On PostgreSQL a large push's one transaction runs on a second writer connection
(``Storage.write_apart``), so that other clients' pushes, to other sessions, are not held
up by it (a 168 MB push held the one writer 8-11 s). Still one transaction: nothing of it
is visible before its COMMIT, and it is acknowledged after."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from ctxd.service import history, ingest, sessions
from ctxd.service.core import Service
from ctxd.store import messages as message_store

from .service_helpers import params


def _held_inserts(monkeypatch: pytest.MonkeyPatch, held_session: str) -> tuple[threading.Event, threading.Event]:
    """Message rows for ``held_session`` stop once written, their transaction still open:
    (set when they are in, set to let the transaction go on)."""
    inside = threading.Event()
    release = threading.Event()
    real = message_store.insert_messages

    def held(conn: Any, session_id: str, rows: Any, *more: Any) -> None:
        real(conn, session_id, rows, *more)
        if session_id == held_session:
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(message_store, "insert_messages", held)
    return inside, release


@pytest.fixture
def storage_url(pg_server: Any) -> str:
    return pg_server.create_database()


async def test_a_small_push_commits_while_a_large_push_is_being_written(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_BYTES", 10_000)  # (the sizes do not matter to the mechanism)
    for sid in ("big", "small"):
        await sessions.create_session(service, params("session/create", sessionId=sid, model="gpt-4o"))
    inside, release = _held_inserts(monkeypatch, "big")
    big = [{"role": "user", "content": f"part {i} " + "lorem ipsum " * 500} for i in range(4)]
    large = asyncio.create_task(ingest.push(service, params("session/push", sessionId="big", messages=big)))
    try:
        while not inside.is_set():
            await asyncio.sleep(0.01)
            assert not large.done(), large
        # The one writer is free: another session's push commits now, not after the large one.
        small = await asyncio.wait_for(ingest.push(service, params(
            "session/push", sessionId="small", messages=[{"role": "user", "content": "hello"}])), 20)
        assert [m.seq for m in small.messages] == [1]
        # And nothing of the large push shows before its COMMIT.
        got = await history.history(service, params("session/history", sessionId="big"))
        assert got.messages == []
    finally:
        release.set()
    result = await asyncio.wait_for(large, 30)
    assert [m.seq for m in result.messages] == [1, 2, 3, 4]
    got = await history.history(service, params("session/history", sessionId="big"))
    assert [m.seq for m in got.messages] == [1, 2, 3, 4]


async def test_bodies_are_compressed_with_lz4_when_the_server_has_it(service: Service, storage_url: str) -> None:
    """The server's default compression (pglz) cost ~130 ms of its CPU per 4 MB body, and on
    2 cores the end of a 168 MB push's COPY held other clients' pushes up by seconds; lz4 is
    ~6x faster. A small push (pipelined INSERT) and a large one (COPY, the second writer
    connection) both store lz4."""
    import psycopg

    with psycopg.connect(storage_url, autocommit=True) as probe:
        try:
            probe.execute("SET default_toast_compression = lz4")
        except psycopg.Error:
            pytest.skip("this PostgreSQL server has no lz4")
    await sessions.create_session(service, params("session/create", sessionId="z", model="gpt-4o"))
    text = " ".join(f"line {i} of a long tool output with words repeated" for i in range(2_000))
    await ingest.push(service, params("session/push", sessionId="z", messages=[{"role": "tool", "content": text,
                                                                                "toolCallId": "c1"}]))
    big = [{"role": "user", "content": f"part {i} " + text * 40} for i in range(2)]
    await ingest.push(service, params("session/push", sessionId="z", messages=big))
    with psycopg.connect(storage_url, autocommit=True) as conn:
        methods = [row[0] for row in conn.execute(
            "SELECT pg_column_compression(body) FROM messages WHERE session_id = 'z' ORDER BY seq")]
    assert methods == ["lz4", "lz4", "lz4"]


@pytest.mark.parametrize("count, size", [(40, 10), (4, 40_000)], ids=["many small", "few large"])
async def test_a_small_push_commits_while_an_import_is_being_written(
        service: Service, monkeypatch: pytest.MonkeyPatch, count: int, size: int) -> None:
    """An import's one transaction (10,000 rows) held every other client's push on the one
    writer for ~230 ms (bench fairness on PostgreSQL): it runs on the second writer. So
    does one of a few large messages (the COPY of 10 x 4 MB held them 240-920 ms)."""
    from ctxd.service import transfer

    await sessions.create_session(service, params("session/create", sessionId="small", model="gpt-4o"))
    inside, release = _held_inserts(monkeypatch, "imported")
    document = {"messages": [{"role": "user" if i % 2 == 0 else "assistant",
                              "content": f"turn {i} ".ljust(size, "x")} for i in range(count)]}
    importing = asyncio.create_task(transfer.import_session(service, params(
        "session/import", document=json.dumps(document), sessionId="imported")))
    try:
        while not inside.is_set():
            await asyncio.sleep(0.01)
            assert not importing.done(), importing
        small = await asyncio.wait_for(ingest.push(service, params(
            "session/push", sessionId="small", messages=[{"role": "user", "content": "hello"}])), 20)
        assert [m.seq for m in small.messages] == [1]
    finally:
        release.set()
    result = await asyncio.wait_for(importing, 30)
    assert result.session_ids == ["imported"]
    got = await history.history(service, params("session/history", sessionId="imported"))
    assert len(got.messages) == count
