"""The database: one SQLite file per data directory, WAL mode, one writer path.

Every write in the daemon goes through :meth:`Database.write`, which queues it for the
single writer (the writer connection's thread). The writer takes whatever jobs are
waiting, runs them in one transaction (each inside its own SAVEPOINT, so one failing job never takes the
others down) and commits once: concurrent clients never see "database is locked",
and under load many pushes share one commit (group commit). A job's caller is
answered only after the COMMIT returned, which is what "acknowledged" means. No task
drives it: a job that finds the writer idle is sent at the end of its loop pass, and a
group's outcome, back on the loop as one callback, answers its jobs and sends the next
group (``_dispatch``): a push's write costs one hop to the thread and one back. A brief
job (``dialect.brief``: a small push) that finds the writer idle, nothing queued and no
other write in the last millisecond runs on the loop's thread instead, on the writer's
connection (no hop; never waiting for another connection's lock: then it is queued as
any other; writes closer together are left to the thread, which groups them).

Jobs and reads are plain synchronous functions of a ``sqlite3.Connection``;
``store/sessions.py`` and ``store/messages.py`` hold them. Each connection lives on a
thread of its own (``store/connection_thread.py``, the standard library's ``sqlite3`` and
``threading``), and a whole transaction is shipped to it as one call: one thread hop
per transaction, not per statement (a push is three statements, and a hop costs more
than the statement: measured 3.3x faster, see docs/decisions.md).

The writer never checkpoints: SQLite's automatic checkpoint would copy the WAL back
into the database, with its fsyncs, inside whichever COMMIT crossed 1000 pages, and
every write queued behind it would wait (0.5-1 s of the 168 MB push's transaction).
A third connection, on its own thread, runs a PASSIVE checkpoint after commits instead,
at most every ``CHECKPOINT_INTERVAL_SECONDS``: it never blocks the writer or readers,
and a commit is as durable as before (it is in the WAL when it is acknowledged).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from ctxd.ownership import foreign, me, owner, writable_dir
from ctxd.protocol.errors import REQUEST_CANCELLED, CtxdError, ErrorCode
from ctxd.store.connection_thread import ConnectionThread, ThreadClosed
from ctxd.store.dialect import is_brief

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_GROUP = 256
BRIEF_GAP_SECONDS = 0.001
"""A brief job (``dialect.brief``) runs on the loop's thread only when no other write
came in this long before it: writes closer together go to the writer's thread, which
groups those that arrive while it commits into one transaction (16 clients pushing one
message at a time: ~10,000 messages/s grouped, ~6,000 each committed alone)."""
CHECKPOINT_INTERVAL_SECONDS = 1.0
"""After a commit, the WAL is checkpointed at once if the last checkpoint is older than
this, else when it is this old (commits meanwhile share one checkpoint); an idle
database is not checkpointed (closing it does that)."""


class StoreOpenError(Exception):
    """The database cannot be used; the message names the file and a way out."""


# Steps SQL cannot express, run inside the migration's transaction (none yet).
_AFTER_MIGRATION: dict[int, Callable[[sqlite3.Connection], None]] = {}


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every bundled migration, in order."""
    found = []
    for entry in resources.files("ctxd.store.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def schema_version() -> int:
    return migrations()[-1][0]


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    started: bool = False
    cancelled: bool = False
    outcome: tuple[bool, Any] | None = None
    """(ok, result or exception) once its transaction ended, whether or not its caller
    still waits on :attr:`future`."""
    after: asyncio.Future[None] | None = None
    """Set when the job ends, for a caller cancelled while the job ran (:meth:`Database.write`)."""


def check_data_dir(directory: Path) -> None:
    """The data directory exists (created 0700 when missing), is ours and writable by
    us (SQLite creates -wal and -shm, the daemon its lock, next to the database);
    StoreOpenError saying why not. Checked explicitly because root would otherwise write
    anywhere without a word."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise StoreOpenError(f"cannot create the data directory {directory}: {exc.strerror}") from None
    try:
        st = os.stat(directory)
    except OSError as exc:
        raise StoreOpenError(f"cannot use the data directory {directory}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StoreOpenError(f"the data directory {directory} is not a directory")
    if foreign(st):
        raise StoreOpenError(f"the data directory {directory} belongs to {owner(st.st_uid)}, not to this "
                             f"user ({me()}); use a directory of your own (--data-dir)")
    if not writable_dir(directory, st):
        raise StoreOpenError(f"the data directory {directory} is not writable (mode "
                             f"{stat.S_IMODE(st.st_mode):o}); SQLite creates its files next to the "
                             f"database. Run: chmod 700 {directory}")


class Database:
    """Owns the writer and reader connections of one database file (the SQLite
    :class:`~ctxd.store.backend.Storage`)."""

    dialect = "sqlite"
    shared = False
    """One daemon per file (the daemon holds store/lock.py's lock): its memory is the truth,
    nothing to re-check."""
    # The checkpointer (see the module doc), started by open(); class defaults so that a
    # subclass with a writer of its own (PostgreSQL) has none.
    _checkpointer: ConnectionThread[sqlite3.Connection] | None = None
    _checkpoint_due: asyncio.Event | None = None
    _checkpoint_task: asyncio.Task[None] | None = None
    checkpoints = 0
    # The writer's queue (:meth:`_init_writer`).
    _pending: deque[_Job]
    _accepting: bool
    _busy: bool
    _soon: bool
    _drained: asyncio.Future[None] | None
    _last_write: float
    brief_gap: float
    _checkpointing: bool
    _restart_due: bool
    _brief_timeout: bool

    def __init__(self, path: Path, *, durability: str = "normal", busy_timeout_ms: int = 5000):
        self.path = Path(path)
        self.durability = durability
        self.busy_timeout_ms = busy_timeout_ms
        # (sqlite3 connections here; PostgresDatabase's are dialect.PgConn)
        self._writer: ConnectionThread[Any] | None = None
        self._reader: ConnectionThread[Any] | None = None
        self._init_writer()
        self.commits = 0
        self.jobs = 0

    # --- lifecycle -----------------------------------------------------------------

    async def open(self) -> None:
        self._check_files()
        try:
            self._writer = ConnectionThread("ctxd-db-writer")
            # (The loop's thread may use the writer's connection between groups: brief jobs.)
            await self._writer.open(partial(self._connect, check_same_thread=False))
            await self._writer.call(self._prepare_writer)
            self._reader = ConnectionThread("ctxd-db-reader")
            await self._reader.open(self._connect)
            await self._reader.call(self._prepare_reader)
            self._checkpointer = ConnectionThread("ctxd-db-checkpoint")
            await self._checkpointer.open(self._connect)
            await self._checkpointer.call(self._prepare_checkpointer)
        except StoreOpenError:
            await self.close()
            raise
        except sqlite3.DatabaseError as exc:
            await self.close()
            raise StoreOpenError(
                f"{self.path}: the database is damaged or not a ctxd database ({exc}). "
                f"Run `ctxd-cli doctor --data-dir {self.path.parent}` to check it and recover "
                f"what can be read into a new file (the old file is kept)."
            ) from None
        except OSError as exc:
            await self.close()
            raise StoreOpenError(f"{self.path}: {exc}") from None
        self._start_writer()
        self._checkpoint_due = asyncio.Event()
        self._checkpoint_task = asyncio.create_task(self._checkpoint_loop(self._checkpoint_due),
                                                    name="ctxd-checkpoint")

    def _check_files(self) -> None:
        """Before SQLite touches anything: the data directory is ours and writable (SQLite
        creates -wal and -shm next to the database), an existing database is ours, and a
        new one is created 0600 here, from its first byte. SQLite gives -wal and -shm the
        database's mode, so they are private from their first byte too (the daemon's
        umask, 077, says the same; this holds for any caller). Checked explicitly because
        root would otherwise write anywhere without a word."""
        check_data_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreOpenError(f"cannot create {self.path}: {exc.strerror}") from None
        else:
            os.close(fd)
            return
        try:
            db = os.stat(self.path)
        except OSError as exc:
            raise StoreOpenError(f"cannot use {self.path}: {exc.strerror}") from None
        if foreign(db):
            raise StoreOpenError(f"{self.path} belongs to {owner(db.st_uid)}, not to this user ({me()}); "
                                 f"use a data directory of your own (--data-dir)")
        if not os.access(self.path, os.R_OK | os.W_OK) or (db.st_mode & 0o600 != 0o600):
            raise StoreOpenError(f"{self.path}: not readable and writable by this user "
                                 f"(mode {stat.S_IMODE(db.st_mode):o}). Run: chmod 600 {self.path}")
        if stat.S_ISREG(db.st_mode) and db.st_size == 0:
            log.warning("%s is empty (0 bytes): it is taken as a new database. If it held sessions, they "
                        "were lost before this start (restore a backup of it if you have one)", self.path)
        for suffix in ("-wal", "-shm"):  # left by an older ctxd with the umask's mode
            side = self.path.with_name(self.path.name + suffix)
            try:
                side_st = os.lstat(side)
            except OSError:
                continue
            if stat.S_ISREG(side_st.st_mode) and not foreign(side_st) and stat.S_IMODE(side_st.st_mode) & 0o077:
                try:
                    os.chmod(side, 0o600)
                except OSError:
                    pass

    def _connect(self, check_same_thread: bool = True) -> sqlite3.Connection:
        # Autocommit mode: the writer says BEGIN/COMMIT itself.
        return sqlite3.connect(self.path, isolation_level=None, check_same_thread=check_same_thread)

    def _prepare_writer(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        # Reading the schema is what fails first on a file that is not a database.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreOpenError(f"{self.path}: cannot switch to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous = " + ("FULL" if self.durability == "full" else "NORMAL"))
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer's job (see the module doc)
        conn.execute("PRAGMA foreign_keys = ON")
        check = conn.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            problems = "; ".join(str(row[0]) for row in check[:3])
            raise sqlite3.DatabaseError(f"integrity check failed: {problems}")
        self._migrate(conn)
        self._drop_unfinished(conn)

    def _drop_unfinished(self, conn: sqlite3.Connection) -> None:
        """Rows of pushes a killed daemon left half-written (``store/messages.py``, "Staged
        pushes"): never acknowledged and never visible, removed before anything else runs."""
        from ctxd.store.messages import drop_unfinished

        conn.execute("BEGIN IMMEDIATE")
        try:
            removed = drop_unfinished(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if removed:
            log.warning("%s: removed %d message rows of pushes that were interrupted before they were stored "
                        "(never acknowledged)", self.path, removed)

    def _prepare_reader(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        conn.execute("PRAGMA query_only = ON")

    def _prepare_checkpointer(self, conn: sqlite3.Connection) -> None:
        # Its checkpoints sync the WAL and the database as the writer's own would have.
        conn.execute("PRAGMA synchronous = " + ("FULL" if self.durability == "full" else "NORMAL"))

    @staticmethod
    def _checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
        return conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()

    async def _checkpoint_loop(self, due: asyncio.Event) -> None:
        """Copy committed WAL frames back into the database, off the writer: a PASSIVE
        checkpoint takes no lock a writer or reader waits for."""
        assert self._checkpointer is not None
        while True:
            await due.wait()
            due.clear()
            self._checkpointing = True
            try:
                busy, frames, copied = await self._checkpointer.call(self._checkpoint)
            except ThreadClosed:
                return
            except sqlite3.Error as exc:  # the WAL keeps the commits; the next one tries again
                log.warning("checkpoint of %s failed: %s", self.path, exc)
            else:
                self.checkpoints += 1
                if not busy and frames > 0 and copied == frames:
                    self._restart_due = True
            finally:
                self._checkpointing = False
            await asyncio.sleep(CHECKPOINT_INTERVAL_SECONDS)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        known = migrations()
        latest = known[-1][0]
        if current > latest:
            raise StoreOpenError(
                f"{self.path}: schema version {current} was written by a newer ctxd; "
                f"this build knows up to {latest}. Upgrade ctxd or point --data-dir elsewhere."
            )
        for version, name, sql in known:
            if version <= current:
                continue
            log.info("applying migration %s", name)
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _split_sql(sql):
                    conn.execute(statement)
                after = _AFTER_MIGRATION.get(version)
                if after is not None:
                    after(conn)
                conn.execute(f"PRAGMA user_version = {version}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    async def close(self) -> None:
        if self._accepting:  # what was queued before commits first; later writes are refused
            self._accepting = False
            if self._busy or self._pending:
                self._drained = asyncio.get_running_loop().create_future()
                if not self._busy and not self._soon:
                    self._dispatch()
                await self._drained
            self._drained = None
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()  # (a checkpoint already started still finishes on its thread)
            try:
                await self._checkpoint_task
            except asyncio.CancelledError:
                pass
            self._checkpoint_task = None
            self._checkpoint_due = None
        # The writer last: closing the last connection checkpoints the WAL and removes it.
        for conn in (self._checkpointer, self._reader, self._writer):
            if conn is not None:
                await conn.close()
        self._checkpointer = self._reader = self._writer = None

    def describe(self) -> str:
        return str(self.path)

    def publish(self, message: str) -> None:
        """No other daemon to tell."""

    async def subscribe(self, deliver: Callable[[str], None],
                        resync: Callable[[float], None] | None = None) -> None:
        """No other daemon to hear from."""

    @asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[None]:
        """Nothing to take: no other daemon writes this file (store/lock.py; the session's own locks
        order this daemon's work)."""
        yield

    # --- reads and writes ----------------------------------------------------------

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, *args, **kwargs)`` on the reader connection (sees every committed write)."""
        assert self._reader is not None, "database is not open"
        if kwargs:
            fn = partial(fn, **kwargs)
        try:
            return await self._reader.call(fn, *args)
        except ThreadClosed:
            raise CtxdError(ErrorCode.StorageError, "the database was closed") from None
        except sqlite3.Error as exc:
            raise CtxdError(ErrorCode.StorageError, f"database read failed: {exc}") from exc

    async def write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, *args, **kwargs)`` inside the writer's next transaction; return once committed.

        Cancelling the caller before the job starts withdraws it. Once it has started it
        commits, and then: a request cancelled by its client (``REQUEST_CANCELLED``) still
        gets its result, so a cancelled request never leaves the client unsure whether
        something was stored; any other cancellation propagates, so a background task
        stopped by cancelling it does stop (instead of carrying on past the cancel).
        """
        if not self._accepting:
            raise CtxdError(ErrorCode.StorageError, "database is closed")
        if kwargs:
            fn = partial(fn, **kwargs)
        now = time.monotonic()
        alone, self._last_write = now - self._last_write > self.brief_gap, now
        if alone and not self._busy and not self._soon and not self._pending and self._runs_here(fn):
            outcome = self._run_here(fn, args)
            if outcome is not None:
                ok, value = outcome
                if not ok:
                    raise _as_ctxd_error(value)
                return value
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop.create_future())
        self._pending.append(job)
        if not self._busy and not self._soon:
            # At the end of this loop pass, not now: the writes issued together (a gather,
            # several clients' requests read in one pass) share one transaction.
            self._soon = True
            loop.call_soon(self._dispatch)
        try:
            # (Not shielded: a cancellation cancels this future, and the job's outcome is
            # still kept on the job. A shield cost a future and a loop pass per write.)
            return await job.future
        except asyncio.CancelledError as cancel:
            if not job.started:
                job.cancelled = True
                raise
            if job.outcome is None:  # still running: its commit first
                job.after = loop.create_future()
                await job.after
            assert job.outcome is not None
            ok, result = job.outcome
            if not ok:
                raise result from None
            if cancel.args[:1] != (REQUEST_CANCELLED,):
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the cancellation is consumed: the request took effect
            return result

    def _runs_here(self, fn: Callable[..., Any]) -> bool:
        """Whether a job may run on the loop's thread, the writer being idle and no write
        having come just before (:data:`BRIEF_GAP_SECONDS`): a brief one
        (``dialect.brief``) whose COMMIT does not wait for the disk (``durability =
        "normal"``: in WAL mode a commit is a write to the log, no fsync), unless the WAL may
        start over with it: after a checkpoint copied all of it back, the next commit
        rewrites the log's header and syncs it (strace: 0.7-2.5 ms), which the writer's
        thread does, not the loop (pushes seconds apart each start it over)."""
        return self.durability != "full" and not self._checkpointing and not self._restart_due and is_brief(fn)

    def _run_here(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any] | None:
        """A brief job's outcome, run in its own transaction on the writer's connection in
        this thread (the writer is idle and nothing is queued); None if another connection
        holds the write lock (the job is then queued for the writer, which waits for it:
        the loop never does). Once begun, it cannot be withdrawn, as a job the writer started."""
        assert self._writer is not None
        self._busy = True
        try:
            outcome = self._writer.run_here(self._brief, (_Job(fn, args, asyncio.get_running_loop().create_future(),
                                                              started=True),))
        except ThreadClosed as exc:
            outcome = (False, exc)
        finally:
            self._busy = False
        if outcome is not None and self._checkpoint_due is not None:
            self._checkpoint_due.set()
        return outcome

    def _brief(self, conn: sqlite3.Connection, job: _Job) -> tuple[bool, Any] | None:
        """The job in a transaction begun without waiting for a lock (``busy_timeout = 0``,
        left so for the next brief job: the writer's thread sets it back before its next
        group, :meth:`_waits_for_locks`). Once BEGIN IMMEDIATE holds the write lock, nothing
        in a WAL-mode transaction waits for another connection (a commit appends to the log;
        the log's restart and checkpoints never wait), so the job runs the same either way."""
        try:
            if not self._brief_timeout:
                self._brief_timeout = True  # (first: an interrupt after the PRAGMA leaves it known)
                conn.execute("PRAGMA busy_timeout = 0")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return None
            return self._run_one(conn, job)
        except BaseException:  # (an interrupt on the loop's thread, anywhere: the connection left clean)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _waits_for_locks(self, conn: sqlite3.Connection) -> None:
        """The writer's connection waits for other connections' locks as configured again
        (on the writer's thread, after brief jobs set it not to)."""
        if self._brief_timeout:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            self._brief_timeout = False

    async def write_apart(self, fn: Callable[..., T], *args: Any) -> T:
        """One writer: the same as :meth:`write` (a large push is staged instead, see
        ``service/ingest.py``)."""
        return await self.write(fn, *args)

    def _init_writer(self) -> None:
        """The writer's queue and state (before :meth:`open`)."""
        self._pending = deque()
        self._accepting = False
        """Writes are taken (from :meth:`_start_writer` until :meth:`close`)."""
        self._busy = False
        """A group is on the writer thread: jobs arriving now wait for the next one."""
        self._soon = False
        """:meth:`_dispatch` is scheduled (the writer was idle when a job came)."""
        self._drained = None
        self._last_write = -1e9
        """When the last write came (``time.monotonic``): :data:`BRIEF_GAP_SECONDS`."""
        self.brief_gap = BRIEF_GAP_SECONDS
        self._checkpointing = False
        """A checkpoint is being made (:meth:`_runs_here`)."""
        self._restart_due = False
        """The last checkpoint copied the whole WAL back: the next commit starts it over."""
        self._brief_timeout = False
        """The writer's connection was left not waiting for locks by a brief job (:meth:`_brief`)."""

    def _start_writer(self) -> None:
        self._accepting = True

    def _dispatch(self) -> None:
        """Hand the waiting jobs (up to ``MAX_GROUP``) to the idle writer thread as one
        transaction. Called by :meth:`write` when the writer is idle, so a lone job goes to
        the thread in the same loop pass (with the other jobs of that pass), and when a group
        has committed: whatever queued meanwhile shares the next commit (group commit). No
        task in between: a job costs one callback, one hop to the thread and one back (a
        writer task's wake-ups cost more loop passes, futures and a task per group)."""
        self._soon = False
        pending = self._pending
        while pending and not self._busy:
            batch: list[_Job] = []
            while pending and len(batch) < MAX_GROUP:
                job = pending.popleft()
                if not job.cancelled:
                    batch.append(job)
            if not batch:
                continue
            for j in batch:
                j.started = True
            assert self._writer is not None
            if not self._checkpointing:
                self._restart_due = False  # (this group's commit starts the WAL over, on the thread)
            try:
                self._writer.send(self._run_group, (batch,), partial(self._finished, batch))
            except ThreadClosed as exc:  # the connection itself is gone
                self._settle(batch, [(False, exc)] * len(batch))
                continue
            self._busy = True
        if not self._busy and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _finished(self, batch: list[_Job], ok: bool, value: Any) -> None:
        """A group's outcome, back on the event loop: the next group starts, then every job
        of this one is answered (after its COMMIT returned)."""
        self._busy = False
        if ok:
            if self._checkpoint_due is not None:
                self._checkpoint_due.set()
            outcomes = value
        else:  # the connection itself failed
            outcomes = [(False, value)] * len(batch)
        self._dispatch()
        self._settle(batch, outcomes)

    @staticmethod
    def _settle(batch: list[_Job], outcomes: list[tuple[bool, Any]]) -> None:
        for j, (ok, value) in zip(batch, outcomes):
            if not ok:
                value = _as_ctxd_error(value)
            j.outcome = (ok, value)
            if not j.future.done():
                if ok:
                    j.future.set_result(value)
                else:
                    j.future.set_exception(value)
            if j.after is not None and not j.after.done():
                j.after.set_result(None)

    def _run_group(self, conn: sqlite3.Connection, batch: list[_Job]) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        self._waits_for_locks(conn)
        conn.execute("BEGIN IMMEDIATE")
        if len(batch) == 1:  # alone in its transaction: no savepoint needed to isolate it
            return [self._run_one(conn, batch[0])]
        try:
            for job in batch:
                conn.execute("SAVEPOINT job")
                try:
                    value = job.fn(conn, *job.args)
                except Exception as exc:
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    outcomes.append((False, exc))
                else:
                    conn.execute("RELEASE job")
                    outcomes.append((True, value))
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.error("commit failed, %d job(s) not stored: %s", len(batch), exc)
            return [(False, exc)] * len(batch)
        self.commits += 1
        self.jobs += len(batch)
        return outcomes

    def _run_one(self, conn: sqlite3.Connection, job: _Job) -> tuple[bool, Any]:
        """One job alone in the transaction begun on ``conn``, committed."""
        try:
            value = job.fn(conn, *job.args)
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return False, exc
        try:
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.error("commit failed, the job was not stored: %s", exc)
            return False, exc
        self.commits += 1
        self.jobs += 1
        return True, value


def _as_ctxd_error(exc: BaseException) -> BaseException:
    if isinstance(exc, (CtxdError, asyncio.CancelledError)):
        return exc
    if isinstance(exc, ThreadClosed):
        return CtxdError(ErrorCode.StorageError, "the database was closed")
    if isinstance(exc, sqlite3.Error):
        return CtxdError(ErrorCode.StorageError, f"database write failed, nothing was stored: {exc}")
    return exc


def _split_sql(script: str) -> list[str]:
    """Statements of a migration script, split where SQLite says a statement is complete
    (so trigger bodies with inner semicolons stay whole)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip() and not all(rest.strip().startswith("--") or not rest.strip()
                                      for rest in current.splitlines()):
        statements.append(current.strip())
    return statements
