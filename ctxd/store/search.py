"""Full-text search over every message (SQLite FTS5, bm25 ranking).

Messages are indexed by a background indexer in batches (``index_pending``); a search
first lets it catch up, so a message is found as soon as its push is acknowledged.
Deleting a session removes its rows from the index by trigger.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

import msgspec

from ctxd.protocol.message import Message, message_text
from ctxd.store import search_pg
from ctxd.store.dialect import is_postgres

_decoder = msgspec.json.Decoder(Message)
_WORD = re.compile(r"\w+", re.UNICODE)
SNIPPET_TOKENS = 24


class QueryError(ValueError):
    """The query cannot be searched (empty, or invalid FTS5 syntax)."""


def fts_query(text: str, syntax: str = "words") -> str:
    """User text as an FTS5 query: each word quoted (so no character is syntax), all required."""
    if syntax == "fts":
        if not text.strip():
            raise QueryError("the query is empty")
        return text
    words = _WORD.findall(text)
    if not words:
        raise QueryError("the query has no words to search for")
    return " ".join(f'"{w}"' for w in words)


@dataclass(slots=True)
class Hit:
    session_id: str
    seq: int
    role: str
    created_at: str
    snippet: str
    score: float
    title: str | None
    body: bytes | None

    def message(self) -> Message | None:
        return _decoder.decode(self.body) if self.body is not None else None


def search(conn: sqlite3.Connection, query: str, *, session_id: str | None = None, role: str | None = None,
           limit: int = 20, with_body: bool = False, unfinished: int = 0) -> list[Hit]:
    """The best ``limit`` matches, ranked by bm25. Ranking runs on the index alone (joined
    to messages only to filter); snippets and rows are fetched for the winners only, so a
    common word matching thousands of messages costs a sort, not thousands of joins.
    On PostgreSQL: ``search_pg.search`` (tsvector + GIN, ``ts_rank_cd``), the same hits.

    The index may hold rows of a push still being written (``store/messages.py``, "Staged
    pushes": indexed like any row, part of no session until their push's last commit):
    winners above their session's ``last_seq`` are dropped, and ``unfinished`` (how many
    such rows there may be) more are ranked so that ``limit`` committed ones remain; when
    that was too few, ranking runs again with room for twice as many."""
    if is_postgres(conn):
        return search_pg.search(conn, query, session_id=session_id, role=role, limit=limit, with_body=with_body,
                                snippet_tokens=SNIPPET_TOKENS, hit=Hit, query_error=QueryError)
    extra = unfinished
    while True:
        hits, ranked, dropped = _search(conn, query, session_id, role, limit + extra, with_body)
        if not dropped or ranked < limit + extra or len(hits) >= limit:
            return hits[:limit]
        extra = 2 * (extra + dropped)


def _search(conn: sqlite3.Connection, query: str, session_id: str | None, role: str | None, limit: int,
            with_body: bool) -> tuple[list[Hit], int, int]:
    rank_sql = "SELECT messages_fts.rowid, bm25(messages_fts) AS score FROM messages_fts"
    args: list[object] = []
    if session_id is not None or role is not None:
        rank_sql += " JOIN messages m ON m.id = messages_fts.rowid"
    rank_sql += " WHERE messages_fts MATCH ?"
    args.append(query)
    if session_id is not None:
        rank_sql += " AND m.session_id = ?"
        args.append(session_id)
    if role is not None:
        rank_sql += " AND m.role = ?"
        args.append(role)
    rank_sql += " ORDER BY score LIMIT ?"
    args.append(limit)
    try:
        ranked = conn.execute(rank_sql, args).fetchall()
        if not ranked:
            return [], 0, 0
        ids = [rowid for rowid, _ in ranked]
        rows = conn.execute(
            "SELECT messages_fts.rowid, m.session_id, m.seq, m.role, m.created_at, "
            f"snippet(messages_fts, 0, '[', ']', '…', {SNIPPET_TOKENS}), s.title"
            + (", m.body" if with_body else ", NULL")
            + " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
            " JOIN sessions s ON s.id = m.session_id"
            f" WHERE messages_fts MATCH ? AND messages_fts.rowid IN ({', '.join('?' * len(ids))})"
            " AND m.seq <= s.last_seq",
            (query, *ids)).fetchall()
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if any(k in text for k in ("locked", "disk", "i/o", "readonly", "corrupt", "malformed database")):
            raise
        # Anything else a MATCH query raises is about the query (FTS5 words its errors freely).
        raise QueryError(f"invalid search syntax: {exc}") from None
    by_id = {row[0]: row[1:] for row in rows}
    hits = []
    for rowid, score in ranked:
        found = by_id.get(rowid)
        if found is not None:
            sid, seq, r, created, snip, title, body = found
            hits.append(Hit(sid, seq, r, created, snip, round(-score, 4), title, body))
    return hits, len(ranked), len(ranked) - len(rows)


def like_scan(conn: sqlite3.Connection, needle: str, limit: int = 20) -> list[tuple[str, int]]:
    """The baseline the search benchmark compares against: a plain LIKE over stored bodies."""
    if is_postgres(conn):
        return search_pg.like_scan(conn, needle, limit)
    # body is a BLOB, and LIKE never matches a BLOB: compare its text.
    return conn.execute("SELECT session_id, seq FROM messages WHERE CAST(body AS TEXT) LIKE ? LIMIT ?",
                        (f"%{needle}%", limit)).fetchall()


def index_pending(conn: sqlite3.Connection, limit: int, max_bytes: int | None = None) -> int:
    """Index up to ``limit`` messages stored since the last call, and no more than about
    ``max_bytes`` of stored bodies (at least one message); how many were indexed.

    The byte bound keeps each indexing transaction short: indexing shares the one writer
    with pushes, and 40 messages of 4 MB would otherwise hold it for seconds."""
    if is_postgres(conn):
        return search_pg.index_pending(conn, limit, max_bytes)
    through = conn.execute("SELECT indexed_through FROM search_state WHERE id = 1").fetchone()[0]
    if max_bytes is not None:
        sizes = conn.execute("SELECT id, length(body) FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                             (through, limit)).fetchall()
        if not sizes:
            return 0
        total, last = 0, sizes[0][0]
        for rowid, size in sizes:
            if total and total + size > max_bytes:
                break
            total += size
            last = rowid
        rows = conn.execute("SELECT id, body FROM messages WHERE id > ? AND id <= ? ORDER BY id",
                            (through, last)).fetchall()
    else:
        rows = conn.execute("SELECT id, body FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                            (through, limit)).fetchall()
    if not rows:
        return 0
    conn.executemany("INSERT INTO messages_fts (rowid, text) VALUES (?, ?)",
                     [(i, message_text(_decoder.decode(b))) for i, b in rows])
    conn.execute("UPDATE search_state SET indexed_through = ? WHERE id = 1", (rows[-1][0],))
    return len(rows)
