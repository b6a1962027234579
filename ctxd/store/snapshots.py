"""Snapshot rows and session events (restores, settings changes)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import msgspec

from ctxd.protocol.compression import Checkpoint
from ctxd.protocol.goal import Goal
from ctxd.protocol.snapshot import SnapshotInfo

_info = msgspec.json.Decoder(SnapshotInfo)
_checkpoints = msgspec.json.Decoder(list[Checkpoint])
_goal = msgspec.json.Decoder(Goal)
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class SnapshotRow:
    info: SnapshotInfo
    state: bytes
    checkpoints: list[Checkpoint]
    goal: Goal | None


def insert_snapshot(conn: sqlite3.Connection, row: SnapshotRow) -> None:
    i = row.info
    conn.execute(
        "INSERT INTO snapshots (session_id, id, created_at, trigger_kind, label, last_seq, info, state, "
        "checkpoints, goal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (i.session_id, i.snapshot_id, i.created_at, i.trigger, i.label, i.last_seq, _encode(i), row.state,
         _encode(row.checkpoints), _encode(row.goal).decode() if row.goal else None))


def list_snapshots(conn: sqlite3.Connection, session_id: str) -> list[SnapshotInfo]:
    """Newest first."""
    rows = conn.execute("SELECT info FROM snapshots WHERE session_id = ? ORDER BY created_at DESC, rowid DESC",
                        (session_id,))
    return [_info.decode(info) for (info,) in rows]


def get_snapshot(conn: sqlite3.Connection, session_id: str, snapshot_id: str) -> SnapshotRow | None:
    row = conn.execute("SELECT info, state, checkpoints, goal FROM snapshots WHERE session_id = ? AND id = ?",
                       (session_id, snapshot_id)).fetchone()
    if row is None:
        return None
    info, state, checkpoints, goal = row
    return SnapshotRow(_info.decode(info), state, _checkpoints.decode(checkpoints),
                       _goal.decode(goal) if goal else None)


def list_rows(conn: sqlite3.Connection, session_id: str) -> list[SnapshotRow]:
    """Every snapshot of the session whole, oldest first (an export carries them)."""
    rows = conn.execute("SELECT info, state, checkpoints, goal FROM snapshots WHERE session_id = ? "
                        "ORDER BY created_at, rowid", (session_id,))
    return [SnapshotRow(_info.decode(info), bytes(state) if not isinstance(state, str) else state.encode(),
                        _checkpoints.decode(checkpoints), _goal.decode(goal) if goal else None)
            for info, state, checkpoints, goal in rows]


def delete_snapshots(conn: sqlite3.Connection, session_id: str, ids: list[str]) -> list[str]:
    deleted = []
    for snapshot_id in ids:
        if conn.execute("DELETE FROM snapshots WHERE session_id = ? AND id = ?", (session_id, snapshot_id)).rowcount:
            deleted.append(snapshot_id)
    return deleted


def rolling_victims(conn: sqlite3.Connection, session_id: str, keep: int, older_than: str | None) -> list[str]:
    """Automatic snapshots beyond the newest ``keep``, and any older than ``older_than``
    (manual snapshots are only removed by age or explicitly)."""
    victims: list[str] = []
    automatic = conn.execute(
        "SELECT id FROM snapshots WHERE session_id = ? AND trigger_kind != 'manual' "
        "ORDER BY created_at DESC, rowid DESC", (session_id,)).fetchall()
    victims += [sid for (sid,) in automatic[keep:]]
    if older_than is not None:
        victims += [sid for (sid,) in conn.execute(
            "SELECT id FROM snapshots WHERE session_id = ? AND created_at < ?", (session_id, older_than))
            if sid not in victims]
    return victims


def add_event(conn: sqlite3.Connection, session_id: str, at: str, kind: str, last_seq: int,
              detail: dict[str, Any] | None = None) -> None:
    conn.execute("INSERT INTO session_events (session_id, at, kind, last_seq, detail) VALUES (?, ?, ?, ?, ?)",
                 (session_id, at, kind, last_seq, _encode(detail).decode() if detail else None))


def list_events(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT at, kind, last_seq, detail FROM session_events WHERE session_id = ? ORDER BY at, rowid",
                        (session_id,))
    return [{"at": at, "kind": kind, "lastSeq": seq, "detail": msgspec.json.decode(d) if d else None}
            for at, kind, seq, d in rows]
