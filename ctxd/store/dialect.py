"""Where SQLite and PostgreSQL differ, for the row code in ``store/*.py``.

Row functions take either a ``sqlite3.Connection`` or a :class:`PgConn` (a psycopg
connection that accepts the same ``?`` placeholders) and ask :func:`is_postgres` at
the few places the dialects differ. This module never imports psycopg: SQLite-only
installs do not need it.
"""

from __future__ import annotations

from typing import Any, Iterable

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

    def copy_rows(self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        """``rows`` into ``table`` by one COPY (far fewer round trips and less parsing than
        INSERTs; triggers fire as for an INSERT)."""
        with self.raw.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self.raw.info.transaction_status != TransactionStatus.IDLE

    def close(self) -> None:
        self.raw.close()


def is_postgres(conn: object) -> bool:
    return type(conn) is PgConn
