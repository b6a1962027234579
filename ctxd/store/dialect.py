"""Where SQLite and PostgreSQL differ, for the row code in ``store/*.py``.

Row functions take either a ``sqlite3.Connection`` or a :class:`PgConn` (a psycopg
connection that accepts the same ``?`` placeholders) and ask :func:`is_postgres` at
the few places the dialects differ. This module never imports psycopg: SQLite-only
installs do not need it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_translated: dict[str, str] = {}


def pg_sql(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled); cached per statement."""
    out = _translated.get(sql)
    if out is None:
        if "'?'" in sql:
            raise ValueError(f"a literal '?' in SQL cannot be translated: {sql}")
        out = _translated[sql] = sql.replace("%", "%%").replace("?", "%s")
    return out


class PgConn:
    """A psycopg connection with the ``sqlite3.Connection`` calls the row code uses."""

    dialect = "postgresql"

    def __init__(self, raw: Any) -> None:
        import psycopg

        self.raw = raw
        self.IntegrityError = psycopg.IntegrityError

    def execute(self, sql: str, parameters: Any = None, /) -> Any:
        return self.raw.execute(pg_sql(sql), parameters or None)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any:
        cursor = self.raw.cursor()
        cursor.executemany(pg_sql(sql), list(parameters))
        return cursor

    def copy_rows(self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]],
                  types: tuple[str, ...] | None = None, between: Callable[[], object] | None = None,
                  every: int = 0) -> None:
        """``rows`` into ``table`` by one COPY (far fewer round trips and less parsing than
        INSERTs; triggers fire as for an INSERT). With ``types`` (the columns' PostgreSQL
        types, exactly) in COPY's binary format: a ``bytea`` goes as it is, where the text
        format writes it out in hex, twice its size, formatted holding the interpreter lock
        (~35 ms a 4 MB body) and parsed again by the server."""
        binary = types is not None
        sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN" + (" (FORMAT BINARY)" if binary else "")
        with self.raw.cursor().copy(sql) as copy:
            if types is not None:
                copy.set_types(list(types))
            done = 0
            for row in rows:
                if between is not None and done >= every:
                    between()
                    done = 0
                copy.write_row(row)
                if between is not None:
                    done += sum(len(v) for v in row if isinstance(v, bytes))

    @property
    def in_pipeline(self) -> bool:
        """Statements are being sent without waiting for their answers (:func:`pipeline_safe`)."""
        return self.raw.pgconn.pipeline_status != 0  # (psycopg.pq.PipelineStatus.OFF)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self.raw.info.transaction_status != TransactionStatus.IDLE

    def close(self) -> None:
        self.raw.close()


def is_postgres(conn: object) -> bool:
    return type(conn) is PgConn


def pipeline_safe(fn: F) -> F:
    """Mark a write job that PostgreSQL may run in pipeline mode: its statements, and the
    BEGIN and COMMIT around it, are sent without waiting for each one's answer, and the
    connection waits only where the job reads a result (a small push: twice, against
    seven or eight times; each wait is a hand-over of the interpreter lock as well as a
    round trip, which another thread's heavy work makes slow). Such a job reads results
    only by fetching them; it never relies on a statement's ``rowcount`` nor catches a
    statement's error (an error is raised where the next answer is read, or at COMMIT, and
    fails the job); COPY is not available (``conn.in_pipeline``). SQLite ignores the mark."""
    fn.ctxd_pipeline_safe = True  # type: ignore[attr-defined]
    return fn


def is_pipeline_safe(fn: Callable[..., Any]) -> bool:
    return bool(getattr(getattr(fn, "func", fn), "ctxd_pipeline_safe", False))


def brief(fn: F) -> F:
    """Mark a write job that SQLite may run on the event loop's thread when the writer is
    idle (``Database.write``): a small push, ~0.15 ms of statements and a COMMIT that
    does not wait for the disk. Handing it to the writer's thread and back cost more
    than that: two wake-ups, each waiting for the interpreter lock, 0.1-0.6 ms on a
    2-core machine whose other core is busy (docs/decisions.md). PostgreSQL ignores the
    mark (its jobs wait for the server)."""
    fn.ctxd_brief = True  # type: ignore[attr-defined]
    return fn


def is_brief(fn: Callable[..., Any]) -> bool:
    return bool(getattr(getattr(fn, "func", fn), "ctxd_brief", False))
