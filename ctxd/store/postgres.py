"""The PostgreSQL backend: one database shared by several ctxd daemons.

The same units of work as SQLite (plain functions of a connection, ``store/*.py``)
on psycopg 3 (``dialect.PgConn`` accepts their ``?`` placeholders), with the same
guarantees:

- **Writes**: one writer connection on a thread of its own takes the waiting jobs and
  runs them in one transaction, each in a SAVEPOINT, answering them only after COMMIT
  (group commit, as ``store/db.py``; the queue and batching are inherited from it).
  A deadlock or serialization failure against another daemon's transaction reruns the
  whole batch; a lost connection fails the batch with a StorageError and the next batch
  reconnects, so the service resumes by itself once the server is back. A transaction of
  jobs marked ``dialect.pipeline_safe`` (a push) runs in pipeline mode: it waits for the
  server where a job reads and at COMMIT, not after every statement.
- **Order per session across daemons**: a push reads its session's ``last_seq`` with
  ``FOR UPDATE`` (``sessions.read_for_push``), so a push through another daemon
  waits for this COMMIT and then continues from the seq written here.
- **Notifications to other daemons** (LISTEN/NOTIFY): sent by a thread of their own
  (:class:`_Notifier`), heard on a connection of their own.
- **One compression pass per session across daemons**: :meth:`exclusive`, a session-level
  advisory lock held on its own connection (released if the daemon dies).
- **Reads**: a psycopg_pool ``ConnectionPool`` of autocommit connections, each read one
  call on a worker thread (one thread hop per read, as SQLite's reader).
- **Migrations**: ``migrations_pg/NNNN_*.sql``, recorded in ``ctxd_schema``, applied under
  a transaction-level advisory lock so daemons starting together apply each once.

The password comes from libpq (``PGPASSWORD``, ``~/.pgpass``, ``PGPASSFILE``) or
``storage.password_file``; the URL never carries one and is what gets logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ctxd.ownership import foreign
from ctxd.protocol.errors import REQUEST_CANCELLED, CtxdError, ErrorCode
from ctxd.store.connection_thread import ConnectionThread, ThreadClosed
from ctxd.store.db import Database, StoreOpenError, _Job
from ctxd.store.dialect import PgConn, is_pipeline_safe

log = logging.getLogger(__name__)

T = TypeVar("T")
TRANSIENT = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.LockNotAvailable)
"""Errors a concurrent transaction of another daemon causes: the batch is simply run again."""
BATCH_ATTEMPTS = 8
CONNECT_TIMEOUT_SECONDS = 10
MIGRATION_LOCK = "ctxd:migrations"
CHANNEL = "ctxd_events"
MAX_NOTIFY_BYTES = 7900
"""PostgreSQL's NOTIFY payload limit is 8000 bytes: a larger message goes in parts."""
MAX_RELAYED_BYTES = 8 << 20
"""Larger than this, a message is not relayed at all (logged)."""
PART = "~"
"""A part of a larger message: ``~<index>/<count>~<text>`` (a whole message is JSON, ``{``)."""
RELISTEN_SECONDS = 1.0


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every bundled PostgreSQL migration, in order."""
    found = []
    for entry in resources.files("ctxd.store.migrations_pg").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def read_password_file(path: Path) -> str:
    """The first line of a password file that is ours and private (0600), as the summarizer's
    key files are (``llm/settings.py``)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StoreOpenError(f"storage.password_file {path}: {exc.strerror}") from None
    if foreign(st):
        raise StoreOpenError(f"storage.password_file {path} is not ours")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise StoreOpenError(f"storage.password_file {path} is readable by others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); run: chmod 600 {path}")
    text = path.read_text(encoding="utf-8")
    return text.splitlines()[0] if text else ""


class _Retry(Exception):
    """The batch met another daemon's transaction (deadlock, serialization): run it again."""


class PostgresDatabase(Database):
    """The PostgreSQL :class:`~ctxd.store.backend.Storage`."""

    dialect = "postgresql"
    shared = True

    def __init__(self, url: str, *, password_file: str = "", pool_size: int = 8) -> None:
        # Not Database.__init__: no file. The writer queue and counters are the same.
        self.url = url
        self.password_file = password_file
        self.pool_size = pool_size
        self._writer = None
        self._reader = None
        self._init_writer()
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._apart: ConnectionThread[PgConn] | None = None
        """A second writer connection, for :meth:`write_apart` (opened when first needed)."""
        self._apart_lock = asyncio.Lock()
        self._broken = False
        self._lz4 = False
        """The server compresses large values with lz4 (decided at open, see :meth:`_writer_conn`)."""
        self._notifier: _Notifier | None = None
        self._closing = False
        self._relay_tasks: list[asyncio.Task[None]] = []
        self.commits = 0
        self.jobs = 0

    def describe(self) -> str:
        return self.url

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg's connection arguments besides the URL (timeout, name, the password file's password)."""
        kwargs: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, "application_name": "ctxd"}
        if self.password_file:
            kwargs["password"] = read_password_file(Path(self.password_file).expanduser())
        return kwargs

    # --- lifecycle -----------------------------------------------------------------

    async def open(self) -> None:
        kwargs = self.connect_kwargs()
        try:
            self._writer = ConnectionThread("ctxd-pg-writer")
            await self._writer.open(partial(self._connect_with, kwargs))
            await self._writer.call(self._migrate)
            self._lz4 = await self._writer.call(self._prefer_lz4)
            self._pool = psycopg_pool.ConnectionPool(
                self.url, min_size=1, max_size=self.pool_size, kwargs={**kwargs, "autocommit": True},
                open=False, name="ctxd-pg-readers")
            await anyio.to_thread.run_sync(partial(self._pool.open, wait=True, timeout=CONNECT_TIMEOUT_SECONDS))
        except StoreOpenError:
            await self.close()
            raise
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await self.close()
            raise StoreOpenError(f"{self.describe()}: cannot use the PostgreSQL database: {exc}") from None
        self._start_writer()

    def _connect_with(self, kwargs: dict[str, Any]) -> PgConn:
        return PgConn(self._writer_conn(kwargs))

    def _writer_conn(self, kwargs: dict[str, Any]) -> psycopg.Connection[Any]:
        """A writer connection: message bodies it stores are compressed with lz4 when the
        server has it. The default (pglz) took ~130 ms of the server's CPU per 4 MB body, and
        the end of a 168 MB push's COPY held other clients' pushes up by seconds on 2 cores
        (lz4: ~6x faster, ~2x larger on disk; docs/decisions.md)."""
        raw = psycopg.connect(self.url, autocommit=True, **kwargs)
        if self._lz4:
            raw.execute("SET default_toast_compression = lz4")
        return raw

    @staticmethod
    def _prefer_lz4(conn: PgConn) -> bool:
        """Whether this server compresses with lz4 (PostgreSQL 14+ built with it); set it for
        the writer's connection if so."""
        try:
            conn.raw.execute("SET default_toast_compression = lz4")
        except psycopg.Error:
            return False
        return True

    def _migrate(self, conn: Any) -> None:  # (a PgConn: the thread's connection here)
        raw = conn.raw
        known = migrations()
        latest = known[-1][0]
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (MIGRATION_LOCK,))
            raw.execute("CREATE TABLE IF NOT EXISTS ctxd_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                        "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            current = raw.execute("SELECT coalesce(max(version), 0) FROM ctxd_schema").fetchone()[0]
            if current > latest:
                raise StoreOpenError(f"{self.describe()}: schema version {current} was written by a newer ctxd; "
                                     f"this build knows up to {latest}. Upgrade ctxd.")
            for version, name, sql in known:
                if version <= current:
                    continue
                log.info("applying PostgreSQL migration %s", name)
                raw.execute(sql.encode())
                raw.execute("INSERT INTO ctxd_schema (version, name) VALUES (%s, %s)", (version, name))

    async def close(self) -> None:
        self._closing = True  # (no notifier is started after this one stopped)
        async with self._apart_lock:  # (a large write under way commits first)
            apart, self._apart = self._apart, None
            if apart is not None:
                await apart.close()
        notifier, self._notifier = self._notifier, None
        if notifier is not None:  # (what was published is sent first)
            notifier.queue.put(None)
            await anyio.to_thread.run_sync(notifier.join, CONNECT_TIMEOUT_SECONDS)
        for task in self._relay_tasks:
            task.cancel()
        await asyncio.gather(*self._relay_tasks, return_exceptions=True)
        self._relay_tasks.clear()
        await super().close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await anyio.to_thread.run_sync(pool.close)

    # --- locks across daemons ------------------------------------------------------

    @asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[None]:
        """A session-level advisory lock on a connection of its own, awaited without holding
        a thread; the connection's end (even the daemon's death) releases it."""
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, **self.connect_kwargs())
        except psycopg.Error as exc:
            raise CtxdError(ErrorCode.StorageError, f"cannot reach the database for a lock: {exc}") from None
        try:
            await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
            yield
        finally:
            await conn.close()

    # --- messages between daemons (LISTEN/NOTIFY) ---------------------------------

    def publish(self, message: str) -> None:
        """Queue ``message`` for the other daemons; one connection, on a thread of its own
        (:class:`_Notifier`), sends them in order (a NOTIFY is delivered in commit order).
        One larger than a NOTIFY goes as parts sent in one transaction, which PostgreSQL
        delivers together."""
        size = len(message.encode())
        if size > MAX_RELAYED_BYTES:
            log.warning("a notification of %d bytes is too large for the other daemons; not relayed", size)
            return
        if self._closing:
            log.debug("closing: a notification was not relayed (the other daemons catch up by reading)")
            return
        if self._notifier is None:
            self._notifier = _Notifier(self.url, self.connect_kwargs)
            self._notifier.start()
        self._notifier.queue.put(message)

    async def subscribe(self, deliver: Callable[[str], None], resync: Callable[[float], None] | None = None) -> None:
        """LISTEN on a connection of its own; reconnects (and listens again) after a failure,
        then calls ``resync(since)``: what other daemons published since ``since`` (a
        ``time.time()``) is lost, and the caller must find out what changed another way."""
        ready = asyncio.get_running_loop().create_future()
        self._relay_tasks.append(asyncio.create_task(self._listen_loop(deliver, ready, resync),
                                                     name="ctxd-pg-listen"))
        await asyncio.wait([ready], timeout=CONNECT_TIMEOUT_SECONDS)

    async def _listen_loop(self, deliver: Callable[[str], None], ready: asyncio.Future[None],
                           resync: Callable[[float], None] | None) -> None:
        lost_at: float | None = None
        while True:
            joined = Reassembly()
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                                                 **self.connect_kwargs()) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if not ready.done():
                        ready.set_result(None)
                    if lost_at is not None and resync is not None:
                        log.info("listening to the other daemons again; catching up with what was missed")
                        try:
                            resync(lost_at)
                        except Exception:
                            log.exception("catching up after a lost LISTEN connection failed")
                    lost_at = None
                    async for note in conn.notifies():
                        notifier = self._notifier
                        if notifier is not None and note.pid == notifier.backend_pid:
                            continue  # (this daemon's own: nothing to deliver)
                        message = joined.add(note.payload)
                        if message is None:
                            continue
                        try:
                            deliver(message)
                        except Exception:
                            log.exception("a notification from another daemon could not be delivered")
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, StoreOpenError) as exc:
                log.warning("listening to the other daemons failed (%s); trying again", exc)
            if lost_at is None:
                lost_at = time.time() - RELISTEN_SECONDS
            await asyncio.sleep(RELISTEN_SECONDS)

    # --- reads ---------------------------------------------------------------------

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, *args, **kwargs)`` on a pooled connection (sees every committed write).
        A connection the server dropped (a restart) is replaced and the read run once more."""
        if self._pool is None:
            raise CtxdError(ErrorCode.StorageError, "the database was closed")
        if kwargs:
            fn = partial(fn, **kwargs)
        for attempt in (1, 2):
            try:
                return await anyio.to_thread.run_sync(self._read_call, fn, args)
            except psycopg.OperationalError as exc:
                if attempt == 2:
                    raise CtxdError(ErrorCode.StorageError, f"database read failed: {exc}") from exc
                pool = self._pool
                if pool is not None:  # the server restarted: replace every idle connection it dropped
                    await anyio.to_thread.run_sync(pool.check)
            except psycopg_pool.PoolTimeout as exc:
                raise CtxdError(ErrorCode.StorageError, f"database read failed: {exc}") from exc
            except psycopg.Error as exc:
                raise CtxdError(ErrorCode.StorageError, f"database read failed: {exc}") from exc
        raise AssertionError("unreachable")

    def _read_call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        pool = self._pool
        if pool is None:
            raise CtxdError(ErrorCode.StorageError, "the database was closed")
        with pool.connection(timeout=CONNECT_TIMEOUT_SECONDS) as raw:
            return fn(PgConn(raw), *args)

    # --- the writer ----------------------------------------------------------------

    def _runs_here(self, fn: Callable[..., Any]) -> bool:
        return False  # (every job waits for the server: never on the loop's thread)

    async def write_apart(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in a transaction of its own on a second writer connection,
        beside the writer's: a push of 168 MB held this daemon's one writer for 8-11 s,
        and every other client's push, whatever its session, waited that long (its rows
        would not hold up theirs: PostgreSQL writes them side by side, as it does other
        daemons'). One such job at a time; the same retries, errors and cancellation as
        :meth:`write` (once started, it commits; a request cancelled by its client still
        gets its result)."""
        if not self._accepting:
            raise CtxdError(ErrorCode.StorageError, "database is closed")
        job = _Job(fn, args, asyncio.get_running_loop().create_future())
        async with self._apart_lock:
            if self._apart is None:
                apart: ConnectionThread[PgConn] = ConnectionThread("ctxd-pg-writer-apart")
                try:
                    await apart.open(partial(self._connect_with, self.connect_kwargs()))
                except (psycopg.Error, StoreOpenError) as exc:
                    await apart.close()
                    raise CtxdError(ErrorCode.StorageError,
                                    f"the database is unreachable, nothing was stored: {exc}") from None
                self._apart = apart
            job.started = True
            call = asyncio.ensure_future(self._apart.call(self._run_apart, job))
            try:
                ok, value = await asyncio.shield(call)
            except asyncio.CancelledError as cancel:
                ok, value = await call
                if cancel.args[:1] != (REQUEST_CANCELLED,) or not ok:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
        if not ok:
            raise value
        return value

    def _run_apart(self, conn: PgConn, job: _Job) -> tuple[bool, Any]:
        if conn.raw.closed:
            try:
                conn.raw = self._writer_conn(self.connect_kwargs())
            except (psycopg.Error, StoreOpenError) as exc:
                return False, CtxdError(ErrorCode.StorageError, f"the database is unreachable, nothing was stored: "
                                                                f"{exc}")
        for _ in range(BATCH_ATTEMPTS):
            try:
                (outcome,) = self._group_once(conn, [job], pipeline=False)
                return outcome
            except _Retry:
                continue
            except psycopg.OperationalError as exc:
                log.error("database connection lost, a large write was not stored: %s", exc)
                return False, CtxdError(ErrorCode.StorageError,
                                        f"the database connection was lost, nothing was stored: {exc}")
        return False, CtxdError(ErrorCode.StorageError, "the write kept conflicting with other daemons' "
                                                        "transactions; nothing was stored")

    def _run_group(self, conn: PgConn, batch: list[_Job]) -> list[tuple[bool, Any]]:  # type: ignore[override]
        for _ in range(BATCH_ATTEMPTS):
            if self._broken or conn.raw.closed:
                try:
                    conn.raw = self._writer_conn(self.connect_kwargs())
                except (psycopg.Error, StoreOpenError) as exc:
                    return [(False, CtxdError(ErrorCode.StorageError,
                                              f"the database is unreachable, nothing was stored: {exc}"))] * len(batch)
                self._broken = False
                log.info("reconnected to %s", self.describe())
            try:
                return self._group_once(conn, batch)
            except _Retry:
                continue
            except psycopg.OperationalError as exc:
                self._broken = True
                log.error("database connection lost, %d job(s) not stored: %s", len(batch), exc)
                return [(False, CtxdError(ErrorCode.StorageError,
                                          f"the database connection was lost, nothing was stored: {exc}"))] * len(batch)
        return [(False, CtxdError(ErrorCode.StorageError, "the write kept conflicting with other daemons' "
                                                          "transactions; nothing was stored"))] * len(batch)

    def _group_once(self, conn: PgConn, batch: list[_Job], pipeline: bool = True) -> list[tuple[bool, Any]]:
        """One transaction of ``batch``; in pipeline mode when every job allows it
        (``dialect.pipeline_safe``) and ``pipeline``: then the connection waits for the
        server only where a job reads a result, at each job's end when there are several
        (so that a job's error is its own), and at COMMIT."""
        raw = conn.raw
        use_pipeline = pipeline and all(is_pipeline_safe(job.fn) for job in batch)
        outcomes: list[tuple[bool, Any]] = []
        several = len(batch) > 1
        try:
            with raw.pipeline() if use_pipeline else nullcontext() as piped:
                try:
                    raw.execute("BEGIN")
                    for job in batch:
                        if several:
                            raw.execute("SAVEPOINT job")
                        try:
                            value = job.fn(conn, *job.args)
                            if several and piped is not None:
                                piped.sync()  # (its statements' errors are raised here, as its own)
                        except TRANSIENT:
                            raise _Retry() from None
                        except Exception as exc:
                            if isinstance(exc, psycopg.OperationalError):
                                raise
                            if piped is not None:
                                _settle(piped)  # (what it sent before failing is answered, errors and all)
                            if not several:
                                raw.execute("ROLLBACK")
                                return [(False, _as_error(exc))]
                            raw.execute("ROLLBACK TO SAVEPOINT job")
                            raw.execute("RELEASE SAVEPOINT job")
                            outcomes.append((False, _as_error(exc)))
                        else:
                            if several:
                                raw.execute("RELEASE SAVEPOINT job")
                            outcomes.append((True, value))
                    raw.execute("COMMIT")
                except (_Retry, psycopg.Error) as exc:
                    if piped is not None and not isinstance(exc, psycopg.OperationalError):
                        _settle(piped)  # (the pipeline ends without a second error to log)
                    raise
            # (In pipeline mode the block's end is where COMMIT, and anything not yet
            # answered, is answered: a single job's late error is raised here.)
        except _Retry:
            _rollback(raw)
            raise
        except TRANSIENT:  # at COMMIT
            _rollback(raw)
            raise _Retry() from None
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            _rollback(raw)
            log.error("commit failed, %d job(s) not stored: %s", len(batch), exc)
            return [(False, _as_error(exc))] * len(batch)
        self.commits += 1
        self.jobs += len(batch)
        return outcomes


class _Notifier(threading.Thread):
    """Sends what :meth:`PostgresDatabase.publish` queues, from a thread with a connection
    of its own: the event loop only queues (sent from the loop, each notification cost it
    an asynchronous round trip, about as much of the loop's time as the push it told of).
    What queued up meanwhile goes in one transaction; its commit does not wait for the WAL
    to reach the disk (``synchronous_commit = off``: a notification is no data, and a
    daemon that missed some after the server went away catches up by other means,
    ``service/relay.py``), so it costs no flush beside the pushes'. Messages are sent in
    the order queued; a message lost with the connection is logged, not retried."""

    def __init__(self, url: str, kwargs: Callable[[], dict[str, Any]]) -> None:
        super().__init__(name="ctxd-pg-notify", daemon=True)
        self.url = url
        self.kwargs = kwargs
        self.queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.backend_pid: int | None = None
        """The server process sending them (what other daemons see as its notifications' pid)."""
        self.transactions = 0

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        pending: list[str] = []
        while True:
            if not pending:
                first = self.queue.get()
                if first is None:
                    break
                pending.append(first)
            stop = False
            while True:  # (whatever else is waiting goes in the same transaction)
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                pending.append(more)
            batch = _one_transaction(pending)
            pending = pending[len(batch):]
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, **self.kwargs())
                    conn.execute("SET synchronous_commit = off")
                    self.backend_pid = conn.info.backend_pid
                parts = [part for message in batch for part in split_message(message)]
                if len(parts) == 1:  # (autocommit: a transaction of its own)
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, parts[0]))
                else:
                    with conn.pipeline(), conn.transaction():
                        for part in parts:
                            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, part))
                self.transactions += 1
            except (psycopg.Error, StoreOpenError) as exc:  # the server is away: these are lost
                log.warning("could not tell the other daemons (%s)", exc)
                if conn is not None:
                    conn.close()
                conn = None
            if stop:
                self.queue.put(None)
        if conn is not None:
            conn.close()


def _one_transaction(messages: list[str]) -> list[str]:
    """The first of ``messages`` that can share a transaction: PostgreSQL delivers a payload
    once however often one transaction notifies it, so a message with a payload already in
    it (a repeated message, or a large one's part that another large one has too: the same
    index, count and text) waits for the next."""
    seen: set[str] = set()
    for index, message in enumerate(messages):
        parts = split_message(message)
        if index and not seen.isdisjoint(parts):
            return messages[:index]
        seen.update(parts)
    return messages


def split_message(message: str, limit: int = MAX_NOTIFY_BYTES) -> list[str]:
    """``message`` as NOTIFY payloads of at most ``limit`` bytes: itself, or parts
    ``~i/n~text`` cut between characters (never inside a UTF-8 sequence)."""
    data = message.encode()
    if len(data) <= limit:
        return [message]
    room = limit - 32  # the part's header
    pieces: list[bytes] = []
    start = 0
    while start < len(data):
        end = min(start + room, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:  # a continuation byte: cut before its sequence
            end -= 1
        pieces.append(data[start:end])
        start = end
    return [f"{PART}{i}/{len(pieces)}{PART}{piece.decode()}" for i, piece in enumerate(pieces, start=1)]


class Reassembly:
    """Parts of a larger message joined again (they arrive together: one transaction's
    notifications are delivered consecutively, in order)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, payload: str) -> str | None:
        """The whole message once ``payload`` completes one (or is one), else None."""
        if not payload.startswith(PART):
            self.parts = []
            return payload
        header, _, text = payload[1:].partition(PART)
        index_text, _, count_text = header.partition("/")
        if not (index_text.isdigit() and count_text.isdigit()):
            log.warning("a notification part from another daemon could not be read; dropped")
            self.parts = []
            return None
        index, count = int(index_text), int(count_text)
        if index == 1:
            self.parts = []
        if index != len(self.parts) + 1:  # a part went missing: drop what was gathered
            log.warning("parts of a notification from another daemon were lost; dropped")
            self.parts = []
            return None
        self.parts.append(text)
        if index < count:
            return None
        message, self.parts = "".join(self.parts), []
        return message


def _settle(piped: Any) -> None:
    """Send what a pipeline holds and read every answer, ignoring errors (the caller is
    already failing the job or the batch)."""
    try:
        piped.sync()
    except psycopg.OperationalError:
        raise
    except psycopg.Error:
        pass


def _rollback(raw: Any) -> None:
    try:
        raw.execute("ROLLBACK")
    except psycopg.Error:
        pass


def _as_error(exc: BaseException) -> BaseException:
    if isinstance(exc, ThreadClosed):
        return CtxdError(ErrorCode.StorageError, "the database was closed")
    if isinstance(exc, psycopg.Error):
        return CtxdError(ErrorCode.StorageError, f"database write failed, nothing was stored: {exc}")
    return exc
