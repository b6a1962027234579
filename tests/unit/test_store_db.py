"""The database layer in process: the single writer (group commit, one SAVEPOINT per
job, answered after COMMIT, cancellation), the reader, opening and closing; the
connections live on threads ctxd owns (``store/connection_thread.py``)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.store import db as db_module
from ctxd.store.connection_thread import ConnectionThread, ThreadClosed
from ctxd.store.db import REQUEST_CANCELLED, Database, StoreOpenError, schema_version
from ctxd.store.dialect import brief


def _make_table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)")


def _insert(conn: sqlite3.Connection, key: str, value: int = 0) -> str:
    conn.execute("INSERT INTO t (k, v) VALUES (?, ?)", (key, value))
    return key


def _keys(conn: sqlite3.Connection) -> list[str]:
    return [k for (k,) in conn.execute("SELECT k FROM t ORDER BY k")]


@pytest.fixture
async def db(tmp_path: Path):
    database = Database(tmp_path / "data" / "ctxd.db")
    await database.open()
    await database.write(_make_table)
    yield database
    await database.close()


async def test_open_prepares_the_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "ctxd.db"
    database = Database(path, durability="full")
    await database.open()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        assert await database.read(lambda c: c.execute("PRAGMA user_version").fetchone()[0]) == schema_version()
        assert await database.read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
        # synchronous is per connection: the writer's is what durability sets (FULL = 2).
        assert await database.write(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
        assert await database.write(lambda c: c.execute("PRAGMA foreign_keys").fetchone()[0]) == 1
        # The reader cannot write.
        with pytest.raises(CtxdError) as info:
            await database.read(lambda c: c.execute("CREATE TABLE x (y)"))
        assert info.value.code == ErrorCode.StorageError
    finally:
        await database.close()


async def test_durability_normal(tmp_path: Path) -> None:
    database = Database(tmp_path / "ctxd.db")
    await database.open()
    try:
        assert await database.write(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 1
    finally:
        await database.close()


async def test_connections_live_on_their_own_threads(db: Database) -> None:
    loop_thread = threading.get_ident()
    writers = await asyncio.gather(*(db.write(lambda c: threading.get_ident()) for _ in range(5)))
    readers = await asyncio.gather(*(db.read(lambda c: threading.get_ident()) for _ in range(5)))
    assert len(set(writers)) == 1 and len(set(readers)) == 1
    assert loop_thread not in writers + readers
    assert writers[0] != readers[0]


async def test_a_write_is_answered_after_commit_and_read_back(db: Database) -> None:
    assert await db.write(_insert, "a", value=1) == "a"
    # Committed: a separate connection sees it.
    other = sqlite3.connect(db.path)
    try:
        assert other.execute("SELECT v FROM t WHERE k = 'a'").fetchone() == (1,)
    finally:
        other.close()
    assert await db.read(_keys) == ["a"]


async def test_concurrent_writes_share_commits(db: Database) -> None:
    commits, jobs = db.commits, db.jobs
    keys = await asyncio.gather(*(db.write(_insert, f"k{i:03}") for i in range(50)))
    assert keys == [f"k{i:03}" for i in range(50)]
    assert db.jobs - jobs == 50
    assert db.commits - commits < 50  # grouped: many jobs, fewer transactions
    assert await db.read(_keys) == keys


@brief
def _insert_brief(conn: sqlite3.Connection, key: str) -> tuple[str, int]:
    conn.execute("INSERT INTO t (k, v) VALUES (?, 0)", (key,))
    return key, threading.get_ident()


@brief
def _interrupted(conn: sqlite3.Connection, key: str) -> None:
    conn.execute("INSERT INTO t (k, v) VALUES (?, 0)", (key,))
    raise KeyboardInterrupt


@pytest.fixture
async def quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A database whose checkpointer has made its first checkpoint and then waits an hour
    (so that no checkpoint starts the WAL over during the test), the restart that follows
    it done by a write on the writer's thread, and no gap required between writes."""
    monkeypatch.setattr(db_module, "CHECKPOINT_INTERVAL_SECONDS", 3600.0)
    database = Database(tmp_path / "data" / "ctxd.db")
    await database.open()
    try:
        await database.write(_make_table)
        for _ in range(1000):
            if database.checkpoints:
                break
            await asyncio.sleep(0.01)
        await database.write(_insert, "-")  # (on the thread: the WAL starts over there)
        database.brief_gap = -1.0
        yield database
    finally:
        await database.close()


async def test_a_brief_job_runs_on_the_loop_thread_when_the_writer_is_idle(quiet: Database) -> None:
    """``dialect.brief``: no hop to the writer's thread and back when it has nothing to do;
    committed before it is answered, as any write."""
    db = quiet
    commits = db.commits
    key, thread = await db.write(_insert_brief, "a")
    assert (key, thread) == ("a", threading.get_ident()) and db.commits == commits + 1
    other = sqlite3.connect(db.path)
    try:
        assert other.execute("SELECT k FROM t WHERE k != '-'").fetchall() == [("a",)]
    finally:
        other.close()
    # Behind a queued write, it is queued too (in order), and runs on the writer's thread.
    first = asyncio.ensure_future(db.write(_insert, "b"))
    await asyncio.sleep(0)
    key, thread = await db.write(_insert_brief, "c")
    assert key == "c" and thread != threading.get_ident() and first.done()
    assert await db.read(_keys) == ["-", "a", "b", "c"]
    # A failing brief job is rolled back and raises as a queued one does.
    _, thread = await db.write(_insert_brief, "d")
    assert thread == threading.get_ident()
    with pytest.raises(CtxdError) as info:
        await db.write(_insert_brief, "a")
    assert info.value.code == ErrorCode.StorageError
    # Interrupted on the loop's thread mid-job: rolled back, the connection usable again.
    with pytest.raises(KeyboardInterrupt):
        await db.write(_interrupted, "e")
    assert (await db.write(_insert_brief, "f"))[0] == "f"
    assert await db.read(_keys) == ["-", "a", "b", "c", "d", "f"]
    assert await db.write(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) == db.busy_timeout_ms


async def test_a_brief_job_never_waits_for_another_connection_on_the_loop(quiet: Database) -> None:
    """Another connection holds SQLite's write lock: the brief job is queued for the
    writer (which waits for the lock) and the loop keeps running meanwhile: the holder lets
    go only once the loop has run a callback (or after 3 s, which fails the test)."""
    db = quiet
    locked, ran = threading.Event(), threading.Event()

    def hold() -> bool:
        holder = sqlite3.connect(db.path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            locked.set()
            return ran.wait(3)
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    holding = asyncio.get_running_loop().run_in_executor(None, hold)
    await asyncio.get_running_loop().run_in_executor(None, locked.wait, 5)
    write = asyncio.ensure_future(db.write(_insert_brief, "x"))
    await asyncio.sleep(0)  # (the write tried, and was queued: the loop runs this task again)
    asyncio.get_running_loop().call_soon(ran.set)
    assert await holding, "the loop was held while another connection had the write lock"
    key, thread = await asyncio.wait_for(write, 10)
    assert key == "x" and thread != threading.get_ident()
    # The writer's connection waits for locks as configured again, on the loop's thread too.
    assert await db.write(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) == db.busy_timeout_ms


async def test_brief_jobs_close_together_are_grouped_on_the_writer_thread(quiet: Database) -> None:
    """Writes coming within ``brief_gap`` of the one before go to the writer's thread,
    which groups them (group commit); after a pause longer than the gap, a brief job runs
    on the loop's thread again."""
    db = quiet
    db.brief_gap = 3600.0
    commits = db.commits
    done = await asyncio.gather(*(db.write(_insert_brief, f"k{i:02}") for i in range(16)))
    assert {thread for _, thread in done} != {threading.get_ident()}
    assert db.commits - commits < 16
    db.brief_gap = 0.5
    await asyncio.sleep(0.6)
    _, thread = await db.write(_insert_brief, "later")
    assert thread == threading.get_ident()
    _, thread = await db.write(_insert_brief, "at once")  # (well within the gap of the one before)
    assert thread != threading.get_ident()


async def test_after_a_whole_checkpoint_the_wal_starts_over_on_the_writer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that copied the whole WAL back makes the next commit start it over,
    syncing its header: that commit goes to the writer's thread, never the loop's; the
    next brief one may run on the loop again (no checkpoint between: the next waits an hour)."""
    monkeypatch.setattr(db_module, "CHECKPOINT_INTERVAL_SECONDS", 3600.0)
    database = Database(tmp_path / "data" / "ctxd.db")
    await database.open()
    try:
        database.brief_gap = -1.0
        await database.write(_make_table)
        for _ in range(1000):
            if database.checkpoints:
                break
            await asyncio.sleep(0.01)
        assert database.checkpoints
        _, thread = await database.write(_insert_brief, "a")
        assert thread != threading.get_ident()
        _, thread = await database.write(_insert_brief, "b")
        assert thread == threading.get_ident()
    finally:
        await database.close()


async def test_a_brief_job_waits_for_the_disk_on_the_writer_thread_when_durability_is_full(tmp_path: Path) -> None:
    database = Database(tmp_path / "data" / "ctxd.db", durability="full")
    await database.open()
    try:
        await database.write(_make_table)
        _, thread = await database.write(_insert_brief, "a")
        assert thread != threading.get_ident()
    finally:
        await database.close()


async def test_a_failing_job_does_not_take_its_group_down(db: Database) -> None:
    def boom(conn: sqlite3.Connection) -> None:
        _insert(conn, "doomed")
        raise ValueError("no")

    results = await asyncio.gather(db.write(_insert, "a"), db.write(boom), db.write(_insert, "b"),
                                   db.write(_insert, "a"), return_exceptions=True)
    assert results[0] == "a" and results[2] == "b"
    assert isinstance(results[1], ValueError)
    # A constraint violation is the database refusing the write: a StorageError, nothing stored.
    assert isinstance(results[3], CtxdError) and results[3].code == ErrorCode.StorageError
    assert "nothing was stored" in results[3].message
    assert await db.read(_keys) == ["a", "b"]


async def test_a_failing_job_alone_is_rolled_back(db: Database) -> None:
    def boom(conn: sqlite3.Connection) -> None:
        _insert(conn, "doomed")
        raise KeyError("no")

    with pytest.raises(KeyError):
        await db.write(boom)
    assert await db.read(_keys) == []
    assert await db.write(lambda c: c.in_transaction) is True  # the next job gets a fresh transaction


class _Gate:
    """A write job that waits, on the writer's thread, until the test lets it go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def job(self, conn: sqlite3.Connection, key: str) -> str:
        self.entered.set()
        assert self.release.wait(30), "the test never released the job"
        return _insert(conn, key)

    async def wait_entered(self) -> None:
        while not self.entered.is_set():
            await asyncio.sleep(0.005)


async def test_cancelled_before_it_started_the_job_is_withdrawn(db: Database) -> None:
    gate = _Gate()
    first = asyncio.create_task(db.write(gate.job, "first"))
    await gate.wait_entered()  # the writer is busy with ``first``
    second = asyncio.create_task(db.write(_insert, "second"))
    await asyncio.sleep(0)  # queued behind it
    second.cancel()
    gate.release.set()
    assert await first == "first"
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await db.read(_keys) == ["first"]


async def test_a_request_cancelled_by_its_client_after_its_write_started_gets_the_result(db: Database) -> None:
    gate = _Gate()
    task = asyncio.create_task(db.write(gate.job, "kept"))
    await gate.wait_entered()
    task.cancel(msg=REQUEST_CANCELLED)
    await asyncio.sleep(0)
    gate.release.set()
    assert await task == "kept"  # it took effect, so it is answered with what it did
    assert await db.read(_keys) == ["kept"]


async def test_any_other_cancellation_after_the_write_started_waits_for_the_commit_then_propagates(
        db: Database) -> None:
    gate = _Gate()
    task = asyncio.create_task(db.write(gate.job, "stored"))
    await gate.wait_entered()
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()  # still waiting for the commit
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await db.read(_keys) == ["stored"]


async def test_a_write_cancelled_while_it_ran_and_failed_raises_its_error(db: Database) -> None:
    """The job's outcome outlives its caller's cancelled future: a failure is reported,
    not swallowed into the cancellation."""
    gate = _Gate()

    def failing(conn: sqlite3.Connection) -> None:
        gate.job(conn, "doomed")
        raise ValueError("refused")

    task = asyncio.create_task(db.write(failing))
    await gate.wait_entered()
    task.cancel(msg=REQUEST_CANCELLED)
    await asyncio.sleep(0)
    gate.release.set()
    with pytest.raises(ValueError, match="refused"):
        await task
    assert await db.read(_keys) == []


async def test_a_write_cancelled_after_its_commit_was_answered_still_gets_the_result(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled in the loop pass its result arrived in, before the caller resumed."""
    tasks: list[asyncio.Task[str]] = []
    settle = db._settle

    def settle_then_cancel(batch: Any, outcomes: Any) -> None:
        settle(batch, outcomes)
        for task in tasks:
            task.cancel(msg=REQUEST_CANCELLED)

    monkeypatch.setattr(db, "_settle", settle_then_cancel)
    tasks.append(asyncio.create_task(db.write(_insert, "done")))
    assert await tasks[0] == "done"
    assert await db.read(_keys) == ["done"]


async def test_commits_reach_the_database_file_through_the_checkpointer(tmp_path: Path) -> None:
    """The writer never checkpoints (a COMMIT that did would hold every queued write
    behind its copy and fsyncs); the checkpointer's connection copies commits into the
    database file on its own thread."""
    path = tmp_path / "data" / "ctxd.db"
    database = Database(path)
    await database.open()
    try:
        assert await database.write(lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
        await database.write(_make_table)
        for i in range(20):
            await database.write(_insert, f"k{i:02d}", i)
        copy = tmp_path / "copy.db"
        found: list[str] = []
        for _ in range(1000):  # until the database file alone (no WAL) holds every row
            copy.write_bytes(path.read_bytes())
            try:
                conn = sqlite3.connect(f"file:{copy}?immutable=1", uri=True)
                try:
                    found = _keys(conn)
                finally:
                    conn.close()
            except sqlite3.Error:
                found = []
            if len(found) == 20:
                break
            await asyncio.sleep(0.01)
        assert found == [f"k{i:02d}" for i in range(20)]
        assert database.checkpoints >= 1
    finally:
        await database.close()


async def test_close_waits_for_queued_writes(tmp_path: Path) -> None:
    database = Database(tmp_path / "ctxd.db")
    await database.open()
    await database.write(_make_table)
    writes = [asyncio.create_task(database.write(_insert, f"k{i}")) for i in range(10)]
    await asyncio.sleep(0)
    await database.close()
    assert [await w for w in writes] == [f"k{i}" for i in range(10)]
    with pytest.raises(CtxdError) as info:
        await database.write(_insert, "late")
    assert info.value.code == ErrorCode.StorageError
    again = Database(tmp_path / "ctxd.db")
    await again.open()
    try:
        assert len(await again.read(_keys)) == 10
    finally:
        await again.close()


async def test_a_file_that_is_not_a_database_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "ctxd.db"
    path.write_bytes(b"this is not SQLite" * 100)
    path.chmod(0o600)
    with pytest.raises(StoreOpenError, match="ctxd-cli doctor"):
        await Database(path).open()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ctxd.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema_version() + 1}")
    conn.close()
    path.chmod(0o600)
    with pytest.raises(StoreOpenError, match="newer ctxd"):
        await Database(path).open()


async def test_a_connection_thread_runs_calls_in_order_and_closes(tmp_path: Path) -> None:
    thread = ConnectionThread("test-sqlite")
    await thread.open(lambda: sqlite3.connect(tmp_path / "x.db", isolation_level=None))
    order: list[int] = []
    await asyncio.gather(*(thread.call(lambda c, i=i: order.append(i)) for i in range(20)))
    assert order == list(range(20))
    with pytest.raises(sqlite3.OperationalError):
        await thread.call(lambda c: c.execute("SELECT * FROM missing"))
    await thread.close()
    with pytest.raises(ThreadClosed):
        await thread.call(lambda c: None)


async def test_a_connection_thread_sends_a_call_and_calls_back_on_the_loop(tmp_path: Path) -> None:
    """``send`` (the writer's path): the call runs on the connection's thread, in order with
    ``call``, and its outcome comes back on the event loop's thread."""
    thread = ConnectionThread("test-sqlite")
    await thread.open(lambda: sqlite3.connect(tmp_path / "x.db", isolation_level=None))
    loop = asyncio.get_running_loop()
    got: list[tuple[bool, Any, str]] = []
    done = loop.create_future()

    def back(ok: bool, value: Any) -> None:
        got.append((ok, value, threading.current_thread().name))
        if len(got) == 2:
            done.set_result(None)

    thread.send(lambda c: (threading.current_thread().name, c.execute("SELECT 7").fetchone()[0]), (), back)
    thread.send(lambda c: c.execute("SELECT * FROM missing"), (), back)
    await asyncio.wait_for(done, 10)
    me = threading.current_thread().name
    assert got[0] == (True, ("test-sqlite", 7), me)
    assert got[1][0] is False and isinstance(got[1][1], sqlite3.OperationalError) and got[1][2] == me
    await thread.close()
    with pytest.raises(ThreadClosed):
        thread.send(lambda c: None, (), back)
