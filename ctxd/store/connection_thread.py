"""A blocking database connection on a thread of its own, driven from asyncio: SQLite's
(``sqlite3``: the writer, the reader, the checkpointer of ``db.py``) and PostgreSQL's
(psycopg: the writers of ``postgres.py``) alike.

A DB-API connection blocks while it works, so each lives on its own thread and the
event loop hands it work: :meth:`ConnectionThread.call` queues ``fn(conn, *args)`` and
resolves with its result (or exception) once the thread ran it. Calls run one at a time,
in the order queued, always on the thread that opened the connection (neither library's
connection may be used from two threads at once). A whole transaction is one call, so
it costs one thread hop however many statements it runs.

This is the standard library only (``threading``, ``queue``); ctxd owns this layer
rather than reaching into a wrapper's private calls (docs/decisions.md, "Foundations").
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T")
C = TypeVar("C", bound=Closable)
"""The connection's type: ``sqlite3.Connection``, or ``dialect.PgConn``."""

_Done = Callable[[bool, Any], object]
_Item = tuple[Callable[..., Any], tuple[Any, ...],
              "asyncio.Future[Any] | tuple[asyncio.AbstractEventLoop, _Done] | None"]


class ThreadClosed(Exception):
    """The connection's thread was stopped: nothing more can run on it."""


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # its caller stopped waiting (cancelled)
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class ConnectionThread(Generic[C]):
    """A database connection opened, used and closed on one dedicated thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: C | None = None
        self._stopped = False

    async def open(self, connect: Callable[[], C]) -> None:
        """Start the thread and open the connection on it with ``connect()``."""
        assert self._thread is None, "already opened"
        # A daemon thread: one the loop forgot to close must not keep the process alive
        # (it only ever waits on its queue between calls; Database.close() lets a
        # started commit finish before anything stops).
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        await self._submit(self._connect, (connect,))

    def _connect(self, connect: Callable[[], C]) -> None:
        self._conn = connect()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the connection's thread; its result or exception.

        Cancelling the caller does not withdraw a call already queued: it still runs
        (the caller just stops waiting for it), as a statement already sent would."""
        if self._conn is None or self._stopped:
            raise ThreadClosed(f"{self.name}: the connection is closed")
        return await self._submit(self._with_conn, (fn, args))

    def send(self, fn: Callable[..., Any], args: tuple[Any, ...], done: _Done) -> None:
        """Queue ``fn(conn, *args)`` like :meth:`call`, and have the running event loop call
        ``done(ok, result_or_exception)`` once it ran: no future and no task between the
        thread and its caller (the database writer's hot path, ``Database._dispatch``)."""
        if self._conn is None or self._stopped:
            raise ThreadClosed(f"{self.name}: the connection is closed")
        self._queue.put((self._with_conn, (fn, args), (asyncio.get_running_loop(), done)))

    def run_here(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """``fn(conn, *args)`` in the calling thread, now. Only for a caller that knows the
        thread is idle and stays so meanwhile (the database writer between its groups:
        ``Database.write`` of a brief job); the connection must allow it
        (``check_same_thread=False``)."""
        if self._stopped:
            raise ThreadClosed(f"{self.name}: the connection is closed")
        return self._with_conn(fn, args)

    def _with_conn(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        conn = self._conn
        if conn is None:
            raise ThreadClosed(f"{self.name}: the connection is closed")
        return fn(conn, *args)

    async def close(self) -> None:
        """Close the connection (after every call queued before) and stop the thread."""
        if self._thread is None or self._stopped:
            return
        self._stopped = True
        try:
            await self._submit(self._close_conn, ())
        finally:
            self._queue.put(None)

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put((fn, args, future))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, future = item
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except BaseException as exc:  # delivered to the caller, whatever it is
                outcome = (False, exc)
            if future is None:
                continue
            try:
                if isinstance(future, tuple):
                    loop, done = future
                    loop.call_soon_threadsafe(done, *outcome)
                else:
                    future.get_loop().call_soon_threadsafe(_resolve, future, *outcome)
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                pass
