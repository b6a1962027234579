"""Message rows: where a message is written, and how history is read back.

History is append-only: a message, once acknowledged, is never changed or removed
except by deleting its session. Compression never comes here.

Staged pushes (SQLite only): a large push writes its rows in several short
transactions, so that it never holds the one writer for long, and a last small
transaction makes them part of the session by raising its ``last_seq`` (with its
totals). Until then the rows lie above the session's committed ``last_seq``: every
read here is bounded by it (a session's history is ``seq <= sessions.last_seq``,
whatever else is stored), and ``unfinished_pushes`` marks them. Rows a killed daemon
left there were never acknowledged: :func:`drop_unfinished` removes them, at start-up
and before the session's next push.

A large import on SQLite is staged the same way (``service/transfer.py``): its session row
is written first with no messages (``last_seq`` 0), marked with ``after_seq``
:data:`IMPORTING`, and its rows above it; the mark also hides the session itself from
every reader (``store/sessions.py``), and :func:`drop_unfinished` removes such a session
whole.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from ctxd.protocol.message import Message
from ctxd.store.dialect import is_postgres
from ctxd.tokens import MessageTokens

_decoder = msgspec.json.Decoder(Message)


@dataclass(slots=True)
class NewMessage:
    """A validated, counted message waiting to be written."""

    message: Message
    body: bytes
    tokens: MessageTokens
    key: str | None
    created_at: str


@dataclass(slots=True)
class StoredMessage:
    seq: int
    created_at: str
    tokens: MessageTokens
    message: Message

    @property
    def role(self) -> str:
        return self.message.role


_COLUMNS = ("session_id", "seq", "role", "created_at", "tokens", "tok_overhead", "tok_text", "tok_tool_call",
            "tok_tool_result", "tok_thinking", "idempotency_key", "body")
BETWEEN_BYTES = 1024 * 1024
_PG_TYPES = ("text", "int8", "text", "text", "int8", "int8", "int8", "int8", "int8", "int8", "text", "bytea")
"""The columns' types on PostgreSQL (``migrations_pg``), for COPY's binary format."""
_INSERT_ARRAYS = (f"INSERT INTO messages ({', '.join(_COLUMNS)}) SELECT * FROM unnest("
                  + ", ".join(f"?::{t}[]" for t in _PG_TYPES) + ")")
"""PostgreSQL: every row in one statement, each column an array."""
_INSERT = f"INSERT INTO messages ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_SELECT = (
    "SELECT seq, created_at, tokens, tok_overhead, tok_text, tok_tool_call, tok_tool_result, "
    "tok_thinking, body FROM messages"
)


def find_keys(conn: sqlite3.Connection, session_id: str, keys: list[str],
              through_seq: int | None = None, *, committed: bool = False) -> dict[str, tuple[int, int]]:
    """Idempotency keys already stored in the session: key -> (seq, tokens). ``through_seq``:
    the session's committed ``last_seq`` (rows of an unfinished push above it were never
    acknowledged, so their keys do not count); ``committed``: the same bound, read from the
    session row by the statement itself."""
    found: dict[str, tuple[int, int]] = {}
    bound_args: tuple[Any, ...]
    if committed:
        bound, bound_args = _COMMITTED, (session_id,)
    else:
        bound, bound_args = ("", ()) if through_seq is None else (" AND seq <= ?", (through_seq,))
    for start in range(0, len(keys), 500):
        chunk = keys[start:start + 500]
        rows = conn.execute(
            f"SELECT idempotency_key, seq, tokens FROM messages WHERE session_id = ? "
            f"AND idempotency_key IN ({', '.join('?' * len(chunk))}){bound}",
            (session_id, *chunk, *bound_args),
        )
        for key, seq, tokens in rows:
            found[key] = (seq, tokens)
    return found


def insert_messages(conn: sqlite3.Connection, session_id: str, rows: Iterable[tuple[int, NewMessage]],
                    between: Callable[[], object] | None = None) -> None:
    """Write messages in the caller's transaction (the search indexer picks them up after). On
    PostgreSQL by COPY: one statement for the batch, about twice as fast as INSERTs; but
    COPY waits for the server twice, and is not allowed in pipeline mode (a small push,
    ``dialect.pipeline_safe``), where one INSERT of the rows as arrays (``unnest``: one
    statement however many rows) goes with the transaction's other statements. ``between``
    (PostgreSQL's COPY only): called after about every ``BETWEEN_BYTES`` of bodies sent, so
    that a large push's rows let other clients' requests run (``service/turns.py``)."""
    values = [(session_id, seq, m.message.role, m.created_at, m.tokens.total, m.tokens.overhead,
               m.tokens.text, m.tokens.tool_call, m.tokens.tool_result, m.tokens.thinking, m.key, m.body)
              for seq, m in rows]
    if is_postgres(conn):
        if conn.in_pipeline:  # type: ignore[attr-defined]
            if values:
                conn.execute(_INSERT_ARRAYS, [list(column) for column in zip(*values)])
            return
        conn.copy_rows("messages", _COLUMNS, values, _PG_TYPES, between, BETWEEN_BYTES)  # type: ignore[attr-defined]
        return
    conn.executemany(_INSERT, values)


_COMMITTED = " AND seq <= (SELECT last_seq FROM sessions WHERE id = ?)"
"""The session's history ends at its committed ``last_seq`` (see "Staged pushes" above)."""


def _stored(row: tuple) -> StoredMessage:
    seq, created, total, overhead, text, call, result, thinking, body = row
    return StoredMessage(seq, created, MessageTokens(total, overhead, text, call, result, thinking),
                         _decoder.decode(body))


def load_range(
    conn: sqlite3.Connection,
    session_id: str,
    after_seq: int = 0,
    through_seq: int | None = None,
    limit: int | None = None,
) -> list[StoredMessage]:
    """Messages with ``after_seq < seq <= through_seq``, oldest first (never beyond the
    session's committed ``last_seq``)."""
    sql = _SELECT + " WHERE session_id = ? AND seq > ?" + _COMMITTED
    args: list[object] = [session_id, after_seq, session_id]
    if through_seq is not None:
        sql += " AND seq <= ?"
        args.append(through_seq)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return [_stored(r) for r in conn.execute(sql, args)]


def load_seqs(conn: sqlite3.Connection, session_id: str, seqs: list[int]) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    for start in range(0, len(seqs), 500):
        chunk = seqs[start:start + 500]
        out += [_stored(r) for r in conn.execute(
            _SELECT + f" WHERE session_id = ? AND seq IN ({', '.join('?' * len(chunk))}){_COMMITTED} ORDER BY seq",
            (session_id, *chunk, session_id))]
    return out


def count_messages(conn: sqlite3.Connection, session_id: str) -> int:
    return conn.execute("SELECT count(*) FROM messages WHERE session_id = ?" + _COMMITTED,
                        (session_id, session_id)).fetchone()[0]


# --- staged pushes (see the module doc) ------------------------------------------------

IMPORTING = -1
"""``after_seq`` of the mark of a staged import: the session itself is unfinished."""


def begin_staged(conn: sqlite3.Connection, session_id: str, after_seq: int, now: str) -> None:
    """Mark the session as having a push in progress above ``after_seq`` (its own short
    transaction, committed before the first of its rows), or, with :data:`IMPORTING`, as
    an import's session not written yet (in the transaction that inserts it)."""
    conn.execute("INSERT INTO unfinished_pushes (session_id, after_seq, started_at) VALUES (?, ?, ?)",
                 (session_id, after_seq, now))


def end_staged(conn: sqlite3.Connection, session_id: str) -> None:
    """In the transaction that raises the session's ``last_seq`` over the staged rows."""
    conn.execute("DELETE FROM unfinished_pushes WHERE session_id = ?", (session_id,))


def drop_import_leftover(conn: sqlite3.Connection, session_id: str) -> int:
    """Remove what an import of ``session_id`` that is no longer running left (its clean-up
    failed: a full disk), before the id is taken again: nothing if the session is not an
    unfinished import's. How many message rows it removed."""
    found = conn.execute("SELECT 1 FROM unfinished_pushes WHERE session_id = ? AND after_seq = ?",
                         (session_id, IMPORTING)).fetchone()
    return drop_unfinished(conn, session_id) if found is not None else 0


def drop_unfinished(conn: sqlite3.Connection, session_id: str | None = None) -> int:
    """Remove the rows of unfinished pushes (of one session, or all): rows above the
    session's committed ``last_seq`` that an ``unfinished_pushes`` row marks, and the
    mark. Never touches a row at or below ``last_seq``; an unfinished import's session
    (:data:`IMPORTING`, never acknowledged nor shown) goes too. How many rows it removed."""
    where, args = ("", ()) if session_id is None else (" WHERE session_id = ?", (session_id,))
    marks = conn.execute(f"SELECT u.session_id, u.after_seq, max(u.after_seq, coalesce(s.last_seq, 0)) "
                         f"FROM unfinished_pushes u LEFT JOIN sessions s ON s.id = u.session_id{where}",
                         args).fetchall()
    removed = 0
    for sid, after, above in marks:
        removed += conn.execute("DELETE FROM messages WHERE session_id = ? AND seq > ?", (sid, above)).rowcount
        conn.execute("DELETE FROM unfinished_pushes WHERE session_id = ?", (sid,))
        if after == IMPORTING:
            conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
    return removed
