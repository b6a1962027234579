"""Checkpoint rows and the record of compression passes.

The active context's checkpoints have a position (their order in the prompt); a
checkpoint merged away keeps its row without a position, so ``checkpoint/expand``
still answers for every id a client was told about.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from ctxd.protocol.compression import Checkpoint

_decoder = msgspec.json.Decoder(Checkpoint)
_encode = msgspec.json.Encoder().encode


def save_active(conn: sqlite3.Connection, session_id: str, checkpoints: list[Checkpoint]) -> None:
    """Make ``checkpoints`` the session's active ones, in order; others are retired."""
    conn.execute("UPDATE checkpoints SET position = NULL WHERE session_id = ? AND position IS NOT NULL",
                 (session_id,))
    conn.executemany(
        "INSERT INTO checkpoints (session_id, id, position, created_at, body) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (session_id, id) DO UPDATE SET position = excluded.position, body = excluded.body",
        [(session_id, cp.id, index, cp.created_at, _encode(cp)) for index, cp in enumerate(checkpoints)],
    )


def load_active(conn: sqlite3.Connection, session_id: str) -> list[Checkpoint]:
    rows = conn.execute(
        "SELECT body FROM checkpoints WHERE session_id = ? AND position IS NOT NULL ORDER BY position",
        (session_id,))
    return [_decoder.decode(body) for (body,) in rows]


def load_retired(conn: sqlite3.Connection, session_id: str) -> list[Checkpoint]:
    """The checkpoints merged away (no position), oldest first: ``checkpoint/expand``
    still answers for them, so an export carries them too."""
    rows = conn.execute(
        "SELECT body FROM checkpoints WHERE session_id = ? AND position IS NULL ORDER BY created_at, id",
        (session_id,))
    return [_decoder.decode(body) for (body,) in rows]


def save_retired(conn: sqlite3.Connection, session_id: str, checkpoints: list[Checkpoint]) -> None:
    """Store checkpoints that are no longer active (an import of an exported session)."""
    conn.executemany(
        "INSERT INTO checkpoints (session_id, id, position, created_at, body) VALUES (?, ?, NULL, ?, ?)",
        [(session_id, cp.id, cp.created_at, _encode(cp)) for cp in checkpoints])


def get_checkpoint(conn: sqlite3.Connection, session_id: str, checkpoint_id: str) -> Checkpoint | None:
    row = conn.execute("SELECT body FROM checkpoints WHERE session_id = ? AND id = ?",
                       (session_id, checkpoint_id)).fetchone()
    return _decoder.decode(row[0]) if row else None


def record_compression(conn: sqlite3.Connection, session_id: str, *, at: str, trigger: str, last_seq: int,
                       layers: list[str],
                       before: int, after: int, checkpoint_ids: list[str], summarizer: str | None,
                       duration_ms: float, detail: dict[str, Any] | None = None) -> int:
    number = conn.execute("SELECT coalesce(max(number), 0) + 1 FROM compressions WHERE session_id = ?",
                          (session_id,)).fetchone()[0]
    conn.execute(
        "INSERT INTO compressions (session_id, number, at, trigger_kind, last_seq, layers, before_tokens, "
        "after_tokens, checkpoint_ids, summarizer, duration_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, number, at, trigger, last_seq, _encode(layers).decode(), before, after,
         _encode(checkpoint_ids).decode(), summarizer, duration_ms, _encode(detail).decode() if detail else None))
    return number


def list_compressions(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT number, at, trigger_kind, last_seq, layers, before_tokens, after_tokens, checkpoint_ids, "
        "summarizer, duration_ms, detail FROM compressions WHERE session_id = ? ORDER BY number", (session_id,))
    out = []
    for number, at, trigger, last_seq, layers, before, after, ids, summarizer, duration, detail in rows:
        out.append({"number": number, "at": at, "trigger": trigger, "lastSeq": last_seq,
                    "layers": msgspec.json.decode(layers),
                    "beforeTokens": before, "afterTokens": after, "checkpointIds": msgspec.json.decode(ids),
                    "summarizer": summarizer, "durationMs": duration,
                    "detail": msgspec.json.decode(detail) if detail else None})
    return out


def insert_compression(conn: sqlite3.Connection, session_id: str, record: dict[str, Any]) -> None:
    """One record of :func:`list_compressions` stored as it was, number included (an
    import of an exported session)."""
    detail = record.get("detail")
    conn.execute(
        "INSERT INTO compressions (session_id, number, at, trigger_kind, last_seq, layers, before_tokens, "
        "after_tokens, checkpoint_ids, summarizer, duration_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, record["number"], record["at"], record["trigger"], record["lastSeq"],
         _encode(record["layers"]).decode(), record["beforeTokens"], record["afterTokens"],
         _encode(record["checkpointIds"]).decode(), record.get("summarizer"), record["durationMs"],
         _encode(detail).decode() if detail is not None else None))
