"""The storage interface the service talks to, and the choice of backend.

Two backends implement :class:`Storage`: SQLite (``store/db.py``, the embedded default:
one file, one daemon) and PostgreSQL (``store/postgres.py``: one database shared by
several daemons). They are chosen by one setting, ``storage.url``: empty or a path
means SQLite, ``postgresql://...`` means PostgreSQL.

A unit of work is a plain synchronous function of a connection, ``fn(conn, *args)``,
shipped whole to the backend's connection thread (one hop per transaction, see
``store/db.py``). Both connections speak the same small DB-API subset (:class:`Conn`);
the row code in ``store/*.py`` writes portable SQL with ``?`` placeholders and asks
:func:`ctxd.store.dialect.is_postgres` where the two dialects differ (row locks, JSON,
full-text search).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


class Conn(Protocol):
    """What a unit of work may use of its connection (``sqlite3.Connection`` has it;
    ``dialect.PgConn`` provides it over psycopg)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor: ...


@runtime_checkable
class Storage(Protocol):
    """What the service needs of a store: run a read, run a write (answered only after
    COMMIT), and hold a lock across daemons."""

    dialect: str
    """``"sqlite"`` or ``"postgresql"``."""
    shared: bool
    """Other daemons may change the same database (what the service must re-check)."""
    commits: int
    jobs: int

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    async def write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    async def write_apart(self, fn: Callable[..., T], *args: Any) -> T:
        """As :meth:`write`, for one large job (a push of 100 MB) that would hold the writer's
        other jobs up: in a transaction of its own, where the store can run it beside them."""
        ...

    def exclusive(self, key: str) -> AbstractAsyncContextManager[None]:
        """Held by one daemon at a time for ``key`` (a compression pass of one session)."""
        ...

    def describe(self) -> str:
        """Where the data is, fit for logs and status (never a password)."""
        ...

    def publish(self, message: str) -> None:
        """Tell the other daemons on this store (in order; nothing without any)."""
        ...

    async def subscribe(self, deliver: Callable[[str], None],
                        resync: Callable[[float], None] | None = None) -> None:
        """Have ``deliver(message)`` called with what other daemons publish, and
        ``resync(since)`` when what they published since ``since`` (``time.time()``) was
        lost (the connection that listens was down)."""
        ...


def is_postgres_url(url: str) -> bool:
    return url.startswith(POSTGRES_SCHEMES)


def open_storage(url: str, *, sqlite_path: Path, durability: str = "normal", busy_timeout_ms: int = 5000,
                 password_file: str = "", pool_size: int = 8) -> Storage:
    """The backend ``storage.url`` names (not opened yet): PostgreSQL for a
    ``postgresql://`` URL, else the SQLite file ``sqlite_path``."""
    from ctxd.store.db import Database

    if is_postgres_url(url):
        try:
            from ctxd.store.postgres import PostgresDatabase
        except ImportError as exc:
            from ctxd.store.db import StoreOpenError

            raise StoreOpenError(f"storage.url names PostgreSQL, but its driver is missing ({exc}): "
                                 "pip install 'ctxd[postgres]'") from None
        return PostgresDatabase(url, password_file=password_file, pool_size=pool_size)
    return Database(sqlite_path, durability=durability, busy_timeout_ms=busy_timeout_ms)
