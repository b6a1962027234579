"""Session rows: create, read, list, delete, and the running totals kept on them.

Functions here take a ``sqlite3.Connection`` and run on the database thread
(``Database.read`` / ``Database.write``); none of them commits.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ctxd.protocol.errors import CtxdError, ErrorCode, session_not_found


class RoleTotals(msgspec.Struct):
    messages: int = 0
    tokens: int = 0


class KindTotals(msgspec.Struct):
    blocks: int = 0
    tokens: int = 0


class DriftTotals(msgspec.Struct):
    messages: int = 0
    reported_output: int = 0
    counted_output: int = 0
    reported_input: int = 0
    counted_input: int = 0


class SessionStats(msgspec.Struct):
    """Per-session aggregates, updated with each push (stored as JSON on the row)."""

    by_role: dict[str, RoleTotals] = {}
    by_kind: dict[str, KindTotals] = {}
    drift: DriftTotals = msgspec.field(default_factory=DriftTotals)


_stats_decoder = msgspec.json.Decoder(SessionStats)
_json = msgspec.json.Encoder()


@dataclass(slots=True)
class SessionRow:
    id: str
    created_at: str
    last_activity: str
    model: str | None
    provider: str | None
    context_window: int | None
    system_prompt: str | None
    system_tokens: int
    title: str | None
    tags: list[str]
    metadata: dict[str, Any]
    encoding: str
    tokens_estimated: bool
    message_count: int
    token_count: int
    context_tokens: int
    last_seq: int
    stats: SessionStats = field(default_factory=SessionStats)


COLUMNS = (
    "id, created_at, last_activity, model, provider, context_window, system_prompt, "
    "system_tokens, title, tags, metadata, encoding, tokens_estimated, message_count, "
    "token_count, context_tokens, last_seq, stats"
)


def _row(values: tuple[Any, ...]) -> SessionRow:
    (sid, created, activity, model, provider, window, system, system_tokens, title, tags,
     metadata, encoding, estimated, count, tokens, context, last_seq, stats) = values
    return SessionRow(
        id=sid, created_at=created, last_activity=activity, model=model, provider=provider,
        context_window=window, system_prompt=system, system_tokens=system_tokens, title=title,
        tags=msgspec.json.decode(tags), metadata=msgspec.json.decode(metadata), encoding=encoding,
        tokens_estimated=bool(estimated), message_count=count, token_count=tokens,
        context_tokens=context, last_seq=last_seq, stats=_stats_decoder.decode(stats),
    )


def insert_session(conn: sqlite3.Connection, row: SessionRow) -> SessionRow:
    try:
        conn.execute(
            f"INSERT INTO sessions ({COLUMNS}) VALUES ({', '.join('?' * 18)})",
            (row.id, row.created_at, row.last_activity, row.model, row.provider, row.context_window,
             row.system_prompt, row.system_tokens, row.title, _json.encode(row.tags),
             _json.encode(row.metadata), row.encoding, int(row.tokens_estimated), row.message_count,
             row.token_count, row.context_tokens, row.last_seq, _json.encode(row.stats)),
        )
    except sqlite3.IntegrityError:
        raise CtxdError(ErrorCode.SessionExists, f"session {row.id!r} already exists",
                        {"field": "sessionId", "sessionId": row.id}) from None
    return row


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRow | None:
    values = conn.execute(f"SELECT {COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return _row(values) if values else None


def require_session(conn: sqlite3.Connection, session_id: str) -> SessionRow:
    row = get_session(conn, session_id)
    if row is None:
        raise session_not_found(session_id)
    return row


def list_sessions(conn: sqlite3.Connection, limit: int | None = None, tag: str | None = None) -> list[SessionRow]:
    sql = f"SELECT {COLUMNS} FROM sessions"
    args: list[Any] = []
    if tag is not None:
        sql += " WHERE EXISTS (SELECT 1 FROM json_each(sessions.tags) WHERE value = ?)"
        args.append(tag)
    sql += " ORDER BY last_activity DESC, id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return [_row(v) for v in conn.execute(sql, args).fetchall()]


def count_sessions(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM sessions").fetchone()[0]


def delete_session(conn: sqlite3.Connection, session_id: str) -> int:
    """Delete the session and everything that references it; returns its message count."""
    found = conn.execute("SELECT message_count FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if found is None:
        raise session_not_found(session_id)
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    return found[0]


def update_totals(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    last_activity: str,
    added_messages: int,
    added_tokens: int,
    context_tokens: int,
    last_seq: int,
    stats: SessionStats,
) -> None:
    conn.execute(
        "UPDATE sessions SET last_activity = ?, message_count = message_count + ?, "
        "token_count = token_count + ?, context_tokens = ?, last_seq = ?, stats = ? WHERE id = ?",
        (last_activity, added_messages, added_tokens, context_tokens, last_seq,
         _json.encode(stats), session_id),
    )
