"""Copy a SQLite database into PostgreSQL (``ctxd-cli migrate --to postgresql://...``).

Everything is copied in one PostgreSQL transaction, so the target holds all of it or
nothing, and verified before COMMIT: per table, the row count and a checksum of the
rows (each row's values hashed, the hashes summed: independent of row order) must be
the same on both sides. Message ids are kept (the identity continues after them);
snapshots and session events keep their order; the search index is rebuilt by the
daemons' indexers (the copied messages are queued for it by the insert trigger).
The target must hold no session yet.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ctxd.protocol.errors import CtxdError, ErrorCode

# (table, ORDER BY on SQLite: the order rows are inserted in, which identity columns keep)
TABLES = (
    ("sessions", "id"),
    ("messages", "id"),
    ("checkpoints", "session_id, id"),
    ("compressions", "session_id, number"),
    ("snapshots", "rowid"),
    ("session_events", "rowid"),
    ("retention_removals", "rowid"),
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


def copy_job(conn: Any, sqlite_path: Path) -> CopyReport:
    """A write job for the PostgreSQL backend (runs in its transaction)."""
    raw = conn.raw
    if raw.execute("SELECT count(*) FROM sessions").fetchone()[0]:
        raise CtxdError(ErrorCode.StorageError, "the target database already holds sessions; copy into an empty one")
    src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True, isolation_level=None)
    src.execute("BEGIN")  # one consistent read of the source (WAL), even while a daemon writes it
    report = CopyReport()
    try:
        for table, order in TABLES:
            src_cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
            types = dict(raw.execute("SELECT column_name, data_type FROM information_schema.columns "
                                     "WHERE table_name = %s AND table_schema = current_schema()", (table,)).fetchall())
            cols = [c for c in src_cols if c in types and not (c == "rowid")]
            text_cols = {i for i, c in enumerate(cols) if types[c] == "text"}
            byte_cols = {i for i, c in enumerate(cols) if types[c] == "bytea"}
            names = ", ".join(cols)
            overriding = " OVERRIDING SYSTEM VALUE" if table == "messages" else ""
            insert = f"INSERT INTO {table} ({names}){overriding} VALUES ({', '.join(['%s'] * len(cols))})"
            cursor = src.execute(f"SELECT {names} FROM {table} ORDER BY {order}")
            count = [0]
            source_sum = 0
            while True:
                chunk = cursor.fetchmany(CHUNK)
                if not chunk:
                    break
                source_sum = (source_sum + _digest(chunk, count)) % (1 << 256)
                raw.cursor().executemany(insert, [
                    tuple(v.decode() if i in text_cols and isinstance(v, bytes)
                          else v.encode() if i in byte_cols and isinstance(v, str) else v
                          for i, v in enumerate(row)) for row in chunk])
            copied = [0]
            target_sum = _digest(raw.execute(f"SELECT {names} FROM {table}"), copied)
            if copied[0] != count[0] or target_sum != source_sum:
                raise CtxdError(ErrorCode.StorageError,
                                f"{table}: the copy does not match the source ({count[0]} rows read, {copied[0]} "
                                f"stored, checksums {'equal' if target_sum == source_sum else 'differ'}); "
                                f"nothing was stored")
            report.counts[table] = count[0]
            report.checksums[table] = f"{source_sum:064x}"[:16]
        raw.execute("SELECT setval(pg_get_serial_sequence('messages', 'id'), "
                    "greatest((SELECT max(id) FROM messages), 1))")
    finally:
        src.close()
    return report
