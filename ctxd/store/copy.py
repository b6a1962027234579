"""Copy a whole ctxd database between SQLite and PostgreSQL (``ctxd-cli migrate``).

Into PostgreSQL (:func:`copy_job`, ``--to postgresql://...``): everything in one
PostgreSQL transaction, so the target holds all of it or nothing. Back into SQLite
(:func:`copy_to_sqlite`, ``--to FILE``): a new file, written in one SQLite transaction
from one consistent (REPEATABLE READ) read of PostgreSQL. Both are verified before
COMMIT: per table, the row count and a checksum of the rows (each row's values hashed,
the hashes summed: independent of row order) must be the same on both sides. Message ids
are kept (the identity or AUTOINCREMENT continues after them); snapshots and session
events keep their order; the search index is rebuilt by the daemon's indexer (the
PostgreSQL insert trigger queues the copied messages; a new SQLite file's index starts
empty). The target must hold no session yet.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.store.messages import IMPORTING

# (table, ORDER BY on SQLite, ORDER BY on PostgreSQL: the order rows are inserted in,
# which identity columns and SQLite's rowid keep)
TABLES = (
    ("sessions", "id", "id"),
    ("messages", "id", "id"),
    ("checkpoints", "session_id, id", "session_id, id"),
    ("compressions", "session_id, number", "session_id, number"),
    ("snapshots", "rowid", "rowid"),
    ("session_events", "rowid", "rowid"),
    ("retention_removals", "rowid", "at, session_id"),
)
CHUNK = 2000


@dataclass
class CopyReport:
    counts: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)


def _norm(value: Any) -> bytes:
    if value is None:
        return b"\x00N"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"\x01" + bytes(value)
    if isinstance(value, str):
        return b"\x01" + value.encode()
    if isinstance(value, float):
        return b"\x02" + repr(value).encode()
    return b"\x02" + str(value).encode()


def _digest(rows: Iterable[tuple[Any, ...]], total: list[int]) -> int:
    acc = 0
    for row in rows:
        h = hashlib.sha256()
        for value in row:
            part = _norm(value)
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        acc = (acc + int.from_bytes(h.digest(), "big")) % (1 << 256)
        total[0] += 1
    return acc


def _copy_table(report: CopyReport, table: str, chunks: Iterable[list[tuple[Any, ...]]],
                insert: Callable[[list[tuple[Any, ...]]], None],
                stored: Callable[[], Iterable[tuple[Any, ...]]]) -> None:
    """Copy one table chunk by chunk and compare what the target holds with what was read."""
    count = [0]
    source_sum = 0
    for chunk in chunks:
        source_sum = (source_sum + _digest(chunk, count)) % (1 << 256)
        insert(chunk)
    copied = [0]
    target_sum = _digest(stored(), copied)
    if copied[0] != count[0] or target_sum != source_sum:
        raise CtxdError(ErrorCode.StorageError,
                        f"{table}: the copy does not match the source ({count[0]} rows read, {copied[0]} "
                        f"stored, checksums {'equal' if target_sum == source_sum else 'differ'}); "
                        f"nothing was stored")
    report.counts[table] = count[0]
    report.checksums[table] = f"{source_sum:064x}"[:16]


def _chunks(cursor: Any) -> Iterable[list[tuple[Any, ...]]]:
    while True:
        chunk = cursor.fetchmany(CHUNK)
        if not chunk:
            return
        yield [tuple(row) for row in chunk]


def copy_job(conn: Any, sqlite_path: Path) -> CopyReport:
    """A write job for the PostgreSQL backend (runs in its transaction)."""
    raw = conn.raw
    if raw.execute("SELECT count(*) FROM sessions").fetchone()[0]:
        raise CtxdError(ErrorCode.StorageError, "the target database already holds sessions; copy into an empty one")
    src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True, isolation_level=None)
    src.execute("BEGIN")  # one consistent read of the source (WAL), even while a daemon writes it
    report = CopyReport()
    try:
        for table, order, _ in TABLES:
            src_cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
            types = dict(raw.execute("SELECT column_name, data_type FROM information_schema.columns "
                                     "WHERE table_name = %s AND table_schema = current_schema()", (table,)).fetchall())
            cols = [c for c in src_cols if c in types and not (c == "rowid")]
            text_cols = {i for i, c in enumerate(cols) if types[c] == "text"}
            byte_cols = {i for i, c in enumerate(cols) if types[c] == "bytea"}
            names = ", ".join(cols)
            overriding = " OVERRIDING SYSTEM VALUE" if table == "messages" else ""
            insert = f"INSERT INTO {table} ({names}){overriding} VALUES ({', '.join(['%s'] * len(cols))})"

            def put(chunk: list[tuple[Any, ...]], insert: str = insert, text_cols: set[int] = text_cols,
                    byte_cols: set[int] = byte_cols) -> None:
                raw.cursor().executemany(insert, [
                    tuple(v.decode() if i in text_cols and isinstance(v, bytes)
                          else v.encode() if i in byte_cols and isinstance(v, str) else v
                          for i, v in enumerate(row)) for row in chunk])

            where = ""
            staging = src.execute("SELECT 1 FROM sqlite_master WHERE name = 'unfinished_pushes'").fetchone()
            if table == "messages" and staging:
                # Rows of a push still being written (or left by a stopped daemon) are no
                # session's history yet: store/messages.py, "Staged pushes".
                where = (" WHERE NOT (session_id IN (SELECT session_id FROM unfinished_pushes) AND seq > "
                         "(SELECT last_seq FROM sessions s WHERE s.id = messages.session_id))")
            elif table == "sessions" and staging:  # nor is the session of an unfinished import
                where = f" WHERE id NOT IN (SELECT session_id FROM unfinished_pushes WHERE after_seq = {IMPORTING})"
            def copied(names: str = names, table: str = table) -> Any:
                return raw.execute(f"SELECT {names} FROM {table}")

            _copy_table(report, table, _chunks(src.execute(f"SELECT {names} FROM {table}{where} ORDER BY {order}")),
                        put, copied)
        raw.execute("SELECT setval(pg_get_serial_sequence('messages', 'id'), "
                    "greatest((SELECT max(id) FROM messages), 1))")
    finally:
        src.close()
    return report


def copy_to_sqlite(pg: Any, path: Path) -> CopyReport:
    """Copy the PostgreSQL database of connection ``pg`` (psycopg, autocommit) into the
    SQLite file ``path``, which holds ctxd's schema and no session yet: one read-only
    REPEATABLE READ transaction there (a consistent picture while daemons keep writing),
    one transaction here, committed only when every table's count and checksum match."""
    dst = sqlite3.connect(path, isolation_level=None)
    try:
        dst.execute("PRAGMA foreign_keys = ON")
        dst.execute("BEGIN IMMEDIATE")
        if dst.execute("SELECT count(*) FROM sessions").fetchone()[0]:
            raise CtxdError(ErrorCode.StorageError, f"{path} already holds sessions; copy into a new file")
        report = CopyReport()
        with pg.transaction():
            pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            for table, _, order in TABLES:
                dst_cols = [r[1] for r in dst.execute(f"PRAGMA table_info({table})")]
                types = dict(pg.execute("SELECT column_name, data_type FROM information_schema.columns "
                                        "WHERE table_name = %s AND table_schema = current_schema()",
                                        (table,)).fetchall())
                missing = [c for c in dst_cols if c not in types]
                if missing:
                    raise CtxdError(ErrorCode.StorageError, f"{table}: the PostgreSQL schema has no column "
                                                            f"{', '.join(missing)}; upgrade ctxd there first")
                names = ", ".join(dst_cols)
                insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join(['?'] * len(dst_cols))})"
                def put_back(chunk: list[tuple[Any, ...]], insert: str = insert) -> None:
                    dst.executemany(insert, chunk)

                def copied_back(names: str = names, table: str = table) -> Any:
                    return dst.execute(f"SELECT {names} FROM {table}")

                _copy_table(report, table, _chunks(pg.execute(f"SELECT {names} FROM {table} ORDER BY {order}")),
                            put_back, copied_back)
        dst.execute("COMMIT")
        return report
    except BaseException:
        if dst.in_transaction:
            dst.execute("ROLLBACK")
        raise
    finally:
        dst.close()
