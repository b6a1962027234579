"""What a push costs the PostgreSQL connection, read from libpq's own trace of the messages
it sends (F) and receives (B).

Each time the writer waits for the server is a round trip and, with another thread busy
(a large push decoded, counted or copied), a hand-over of the interpreter lock that waits
for that thread: a one-message push that sent BEGIN, its statements and COMMIT one by one
waited seven times, 20-30 ms under such load, and a client pushing every 10 ms fell behind
(docs/performance.md, "Fairness benchmark"). Now the push runs in pipeline mode and waits
where it reads (its session row, the idempotency keys) and at COMMIT. A large push's rows go
by COPY in its binary format: the bodies as they are, not written out in hex."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from ctxd.service import history, ingest, sessions, turns
from ctxd.service.core import Service

from .service_helpers import params


@pytest.fixture
def storage_url(pg_server: Any) -> str:
    return pg_server.create_database()


class Trace:
    """libpq's trace of the writer connection's protocol messages, while in ``with``."""

    def __init__(self, service: Service, path: Path) -> None:
        self.service = service
        self.path = path
        self.lines: list[str] = []

    async def __aenter__(self) -> Trace:
        self.file = open(self.path, "w")  # noqa: SIM115
        fd = self.file.fileno()

        def start(conn: Any) -> None:
            from psycopg import pq

            conn.raw.pgconn.trace(fd)
            conn.raw.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

        await self.service.db._writer.call(start)  # type: ignore[attr-defined]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.service.db._writer.call(lambda conn: conn.raw.pgconn.untrace())  # type: ignore[attr-defined]
        self.file.close()
        self.lines = [line for line in self.path.read_text().splitlines() if line[:2] in ("F\t", "B\t")]

    def waits(self) -> int:
        """How many times the client sent and then read: its round trips."""
        count, last = 0, ""
        for line in self.lines:
            if line[0] == "B" and last == "F":
                count += 1
            last = line[0]
        return count

    def sent(self, kind: str) -> list[str]:
        return [line for line in self.lines if line.startswith("F\t") and line.split("\t")[2] == kind]


async def _session(service: Service, sid: str) -> None:
    await sessions.create_session(service, params("session/create", sessionId=sid, model="gpt-4o"))
    for i in range(6):  # (psycopg prepares a statement after a few runs: a steady state)
        await ingest.push(service, params("session/push", sessionId=sid,
                                          messages=[{"role": "user", "content": f"warm-up {i}"}]))


async def test_a_one_message_push_waits_for_postgresql_twice(service: Service, tmp_path: Path) -> None:
    await _session(service, "s")
    async with Trace(service, tmp_path / "trace") as trace:
        result = await ingest.push(service, params("session/push", sessionId="s",
                                                   messages=[{"role": "user", "content": "hello"}]))
    assert [m.seq for m in result.messages] == [7]
    # Once for the session row it locks and reads, once for COMMIT (BEGIN, the row, the
    # update go with them): before, seven (BEGIN, the row, the context, COPY twice, the
    # update, COMMIT).
    assert trace.waits() == 2, "\n".join(trace.lines)
    got = await history.history(service, params("session/history", sessionId="s"))
    assert [m.seq for m in got.messages][-1] == 7


async def test_idempotency_keys_are_looked_up_in_the_same_round_trip(service: Service, tmp_path: Path) -> None:
    await _session(service, "k")
    first = await ingest.push(service, params("session/push", sessionId="k", messages=[
        {"role": "user", "content": "once", "idempotencyKey": "a"}]))
    async with Trace(service, tmp_path / "trace") as trace:
        again = await ingest.push(service, params("session/push", sessionId="k", messages=[
            {"role": "user", "content": "once", "idempotencyKey": "a"},
            {"role": "assistant", "content": "new", "idempotencyKey": "b"}]))
    assert again.messages[0].duplicate and again.messages[0].seq == first.messages[0].seq
    assert [m.seq for m in again.messages] == [7, 8] and not again.messages[1].duplicate
    assert trace.waits() == 2, "\n".join(trace.lines)


async def test_a_failed_pipelined_push_stores_nothing_and_the_next_one_works(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error the server raises for a statement the push did not wait for comes at COMMIT:
    the push fails whole, and the connection is usable after it."""
    from ctxd.store import sessions as session_store

    await _session(service, "f")
    real = session_store.update_totals

    def broken(conn: Any, session_id: str, **kw: Any) -> None:
        real(conn, session_id, **kw)
        conn.execute("SELECT 1 / 0")  # (sent, not waited for)

    monkeypatch.setattr(session_store, "update_totals", broken)
    with pytest.raises(Exception) as failed:
        await ingest.push(service, params("session/push", sessionId="f",
                                          messages=[{"role": "user", "content": "lost"}]))
    # The statement's own error, or, when psycopg read its answer before the next statement
    # went (a matter of timing), "pipeline aborted": then the connection is taken as lost and
    # opened again. Either way the push fails whole.
    assert "division by zero" in str(failed.value) or "pipeline aborted" in str(failed.value)
    monkeypatch.setattr(session_store, "update_totals", real)
    result = await ingest.push(service, params("session/push", sessionId="f",
                                               messages=[{"role": "user", "content": "kept"}]))
    got = await history.history(service, params("session/history", sessionId="f"))
    assert [m.message.content for m in got.messages][-1] == "kept"
    assert "lost" not in [m.message.content for m in got.messages]
    assert result.messages[0].seq == got.messages[-1].seq


async def test_a_large_push_copies_its_bodies_as_they_are_and_steps_aside_between_rows(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_BYTES", 10_000)  # (a large push: COPY on the second writer)
    from ctxd.store import messages as message_store

    monkeypatch.setattr(message_store, "BETWEEN_BYTES", 1, raising=False)
    await sessions.create_session(service, params("session/create", sessionId="big", model="gpt-4o"))
    steps: list[str] = []
    real_step = turns.TURNS.step_aside

    def step_aside() -> float:
        steps.append(threading.current_thread().name)
        return real_step()

    monkeypatch.setattr(turns.TURNS, "step_aside", step_aside)
    sent: list[int] = []
    from psycopg.copy import LibpqWriter

    real_write = LibpqWriter.write

    def write(self: Any, data: Any) -> None:
        sent.append(len(data))
        real_write(self, data)

    monkeypatch.setattr(LibpqWriter, "write", write)
    big = [{"role": "user", "content": f"part {i} " + "lorem ipsum " * 2000} for i in range(4)]
    result = await ingest.push(service, params("session/push", sessionId="big", messages=big))
    assert [m.seq for m in result.messages] == [1, 2, 3, 4]
    got = await history.history(service, params("session/history", sessionId="big"))
    assert [m.message.content for m in got.messages] == [m["content"] for m in big]
    bodies = sum(len(m["content"]) for m in big)
    copied = sum(sent)
    # Binary: about the bodies' size (the text format writes a bytea in hex: over twice).
    assert bodies < copied < 1.3 * bodies, (bodies, copied)
    # Between the rows, on the connection's thread, other clients' requests may run.
    assert steps.count("ctxd-pg-writer-apart") == 3, steps


async def test_pipelined_jobs_sharing_a_transaction_fail_alone(service: Service) -> None:
    """Several pipelined jobs in one group commit: each waits for the server at its end, so
    an error the server raises for a statement it sent is that job's alone."""
    import asyncio

    from ctxd.protocol.errors import CtxdError
    from ctxd.store.dialect import pipeline_safe

    for sid in ("a", "b"):
        await sessions.create_session(service, params("session/create", sessionId=sid, model="gpt-4o"))

    @pipeline_safe
    def title(conn: Any, sid: str) -> str:
        conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (f"titled {sid}", sid))
        return sid

    @pipeline_safe
    def late_error(conn: Any) -> None:
        conn.execute("UPDATE sessions SET title = 'never' WHERE id = 'a'")
        conn.execute("SELECT 1 / 0")  # (sent; its error comes where the job ends)

    @pipeline_safe
    def python_error(conn: Any) -> None:
        conn.execute("UPDATE sessions SET title = 'never' WHERE id = 'b'")
        raise ValueError("refused")

    commits = service.db.commits  # type: ignore[attr-defined]
    got = await asyncio.gather(service.db.write(title, "a"), service.db.write(late_error),
                               service.db.write(python_error), service.db.write(title, "b"),
                               return_exceptions=True)
    assert service.db.commits == commits + 1  # type: ignore[attr-defined]  # (one transaction)
    assert got[0] == "a" and got[3] == "b"
    assert isinstance(got[1], CtxdError) and "division by zero" in str(got[1])
    assert isinstance(got[2], ValueError)

    def titles(conn: Any) -> list[tuple[str, str]]:
        return [tuple(r) for r in conn.execute("SELECT id, title FROM sessions ORDER BY id").fetchall()]

    assert await service.db.read(titles) == [("a", "titled a"), ("b", "titled b")]


def test_notifications_go_from_a_thread_what_waited_in_one_transaction_in_order(pg_server: Any) -> None:
    """What other daemons are told (``Storage.publish``) is sent by a thread of its own, not
    by the event loop (an asynchronous round trip per push cost the loop about as much as
    the push). What queued up meanwhile goes in one transaction, in order; a message
    repeated within it waits for the next (PostgreSQL would deliver it once)."""
    import psycopg

    from ctxd.store.postgres import CHANNEL, _Notifier, split_message

    url = pg_server.create_database()
    listener = psycopg.connect(url, autocommit=True)
    try:
        listener.execute(f"LISTEN {CHANNEL}")
        big = "é" * 9000  # (in parts)
        sent = ["one", "two", "one", big, "three"]
        notifier = _Notifier(url, dict)
        for message in sent:  # (queued before the thread runs: all of them wait)
            notifier.queue.put(message)
        notifier.queue.put(None)
        notifier.start()
        notifier.join(30)
        assert not notifier.is_alive()
        assert notifier.transactions == 2  # ("one", "two") and ("one", big, "three")
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=len(sent) - 1 + len(split_message(big)))]
        assert heard == ["one", "two", "one", *split_message(big), "three"]
        assert notifier.backend_pid is not None
    finally:
        listener.close()


async def test_a_batch_keeps_copy(service: Service, tmp_path: Path) -> None:
    """Past ``ingest.PIPELINE_MESSAGES`` a push keeps COPY (a pipeline cannot hold one; the
    rows as INSERTs went in at half the rate), in the binary format."""
    await _session(service, "batch")
    batch = [{"role": "user", "content": f"message {i}"} for i in range(ingest.PIPELINE_MESSAGES + 1)]
    async with Trace(service, tmp_path / "trace") as trace:
        result = await ingest.push(service, params("session/push", sessionId="batch", messages=batch))
    assert len(result.messages) == len(batch)
    assert trace.sent("CopyData")
    copy = [line for line in trace.lines if "COPY messages" in line]
    assert copy and "FORMAT BINARY" in copy[0]


def test_two_large_notifications_sharing_a_part_both_arrive(pg_server: Any) -> None:
    """The notifier puts what is queued in one transaction, and PostgreSQL delivers a payload
    once per transaction: two different large messages whose first parts are the same (same
    index, count and text) lost one of them."""
    import psycopg

    from ctxd.store.postgres import CHANNEL, Reassembly, _Notifier, split_message

    url = pg_server.create_database()
    listener = psycopg.connect(url, autocommit=True)
    try:
        listener.execute(f"LISTEN {CHANNEL}")
        common = "x" * 9000
        a, b = common + "A", common + "B"
        assert split_message(a)[0] == split_message(b)[0]
        notifier = _Notifier(url, dict)
        for message in (a, b, None):
            notifier.queue.put(message)
        notifier.start()
        notifier.join(30)
        joined = Reassembly()
        got = [m for m in (joined.add(n.payload) for n in listener.notifies(timeout=3)) if m is not None]
        assert got == [a, b]
    finally:
        listener.close()


async def test_a_notification_published_while_closing_starts_no_new_notifier(pg_server: Any) -> None:
    """close() stops the notifier thread; a notification published while it waits for that
    thread started a new one, with a connection nothing would ever close (found by review)."""
    from ctxd.store.postgres import PostgresDatabase

    db = PostgresDatabase(pg_server.create_database())
    await db.open()
    db.publish('{"m": 1}')
    closing = asyncio.create_task(db.close())
    await asyncio.sleep(0)  # (close is waiting for the notifier thread)
    db.publish('{"m": 2}')
    await closing
    assert not [t for t in threading.enumerate() if t.name == "ctxd-pg-notify" and t.is_alive()]
