"""Session rows: create, read, list, delete, and the running totals kept on them.

Functions here take a ``sqlite3.Connection`` and run on the database thread
(``Database.read`` / ``Database.write``); none of them commits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ctxd.protocol.compression import SessionSettings
from ctxd.protocol.errors import CtxdError, ErrorCode, session_not_found
from ctxd.protocol.goal import Goal
from ctxd.protocol.message import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ctxd.store.dialect import is_postgres
from ctxd.store.messages import IMPORTING, find_keys
from ctxd.tokens import MessageTokens


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
    history_context: int = 0
    """Context tokens of every message pushed (what a client sending all history sends)."""
    usage_samples: list[tuple[int, int]] = []
    """The newest (ctxd's count, provider's count) pairs, oldest first (engine/calibration.py)."""


class BillTotals(msgspec.Struct, omit_defaults=True):
    """A session's requests as billed (``service/billing.py``): each ``(uncached, written,
    read)`` in the provider's count; ``*_billed`` weighed by the rules in force when the
    request was made, in uncached input tokens; ``ctxd`` and ``direct`` both ctxd's
    estimates (one rule for both sides); ``reported``: ctxd's ``measured`` requests as the
    provider's usage said, ``reported_estimate`` ctxd's estimate of the same requests;
    ``last``: the newest request's ctxd and direct triples and whether the provider
    reported it (``last_reported``: what it said)."""

    requests: int = 0
    measured: int = 0
    ctxd: tuple[int, int, int] = (0, 0, 0)
    direct: tuple[int, int, int] = (0, 0, 0)
    ctxd_billed: float = 0.0
    direct_billed: float = 0.0
    passes: int = 0
    pass_cost: float = 0.0
    last: tuple[tuple[int, int, int], tuple[int, int, int], bool] | None = None
    reported: tuple[int, int, int] = (0, 0, 0)
    reported_billed: float = 0.0
    reported_estimate: float = 0.0
    last_reported: tuple[int, int, int] | None = None


KINDS = ("text", "toolCall", "toolResult", "thinking", "framing")
_KIND_SET = frozenset(KINDS)


def counted_role(message: Message) -> str:
    """The role a message is counted under: its own, except a user message that carries no
    words of the user's, only tool results (Anthropic's shape for them) or tool output an
    agent sends as a user message (``metadata.observation``): that one is ``tool``. The
    user's messages are what the user wrote (``context/stats``, snapshots)."""
    if message.role != "user":
        return message.role
    metadata = message.metadata
    if metadata and metadata.get("observation") is True:
        return "tool"
    content = message.content
    if isinstance(content, list) and content and any(isinstance(b, ToolResultBlock) for b in content) \
            and not any(isinstance(b, TextBlock) and b.text.strip() for b in content):
        return "tool"
    return "user"


class SessionStats(msgspec.Struct):
    """Per-session aggregates, updated with each push (stored as JSON on the row). Roles are
    counted as :func:`counted_role` says (tool results sent as user messages are ``tool``)."""

    by_role: dict[str, RoleTotals] = {}
    by_kind: dict[str, KindTotals] = {}
    drift: DriftTotals = msgspec.field(default_factory=DriftTotals)
    bill: BillTotals = msgspec.field(default_factory=BillTotals)

    def add_message(self, message: Message, tokens: MessageTokens) -> None:
        """Count one message into the role and kind totals (the drift is the caller's)."""
        self.add_messages(((message, tokens),))

    def add_messages(self, counted: Iterable[tuple[Message, MessageTokens]]) -> None:
        """Count messages into the role and kind totals (the drift is the caller's). A push's
        batch is summed in local variables first and added to the Structs once: this runs on
        the writer, inside the push's transaction, for every message."""
        roles: dict[str, list[int]] = {}
        n_text = n_call = n_result = n_thinking = n_framing = 0
        t_text = t_call = t_result = t_thinking = t_framing = 0
        for message, tokens in counted:
            role = counted_role(message)
            totals = roles.get(role)
            if totals is None:
                totals = roles[role] = [0, 0]
            totals[0] += 1
            totals[1] += tokens.total
            content = message.content
            calls = message.tool_calls
            texts = results = 0
            if isinstance(content, str):
                texts = 1 if content else 0
            else:
                for block in content or ():
                    if isinstance(block, TextBlock):
                        texts += 1
                    elif isinstance(block, ToolUseBlock):
                        n_call += 1
                    elif isinstance(block, ToolResultBlock):
                        results += 1
                    elif isinstance(block, ThinkingBlock):
                        n_thinking += 1
            if message.role == "tool":  # all tool output, whatever form its content takes
                texts, results = 0, max(results, 1)
            n_text += texts
            n_result += results
            if calls:
                n_call += len(calls)
            n_framing += 1
            t_text += tokens.text
            t_call += tokens.tool_call
            t_result += tokens.tool_result
            t_thinking += tokens.thinking
            t_framing += tokens.overhead
        for name, (messages, role_tokens) in roles.items():
            kept = self.by_role.get(name)
            if kept is None:
                kept = self.by_role[name] = RoleTotals()
            kept.messages += messages
            kept.tokens += role_tokens
        by_kind = self.by_kind
        if not by_kind.keys() >= _KIND_SET:  # (once per session: every kind is listed, zeros included)
            for kind in KINDS:
                if kind not in by_kind:
                    by_kind[kind] = KindTotals()
        for kind, blocks, kind_tokens in (("text", n_text, t_text), ("toolCall", n_call, t_call),
                                          ("toolResult", n_result, t_result),
                                          ("thinking", n_thinking, t_thinking), ("framing", n_framing, t_framing)):
            kind_totals = by_kind[kind]
            kind_totals.blocks += blocks
            kind_totals.tokens += kind_tokens


_stats_decoder = msgspec.json.Decoder(SessionStats)
_goal_decoder = msgspec.json.Decoder(Goal)
_settings_decoder = msgspec.json.Decoder(SessionSettings)
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
    context_state: bytes = b"{}"
    """The engine's CompressionState as JSON (opaque here)."""
    goal: Goal | None = None
    settings: SessionSettings = field(default_factory=SessionSettings)
    model_info: dict[str, Any] = field(default_factory=dict)


COLUMNS = (
    "id, created_at, last_activity, model, provider, context_window, system_prompt, "
    "system_tokens, title, tags, metadata, encoding, tokens_estimated, message_count, "
    "token_count, context_tokens, last_seq, stats, context_state, goal, settings, model_info"
)


def _row(values: tuple[Any, ...]) -> SessionRow:
    (sid, created, activity, model, provider, window, system, system_tokens, title, tags,
     metadata, encoding, estimated, count, tokens, context, last_seq, stats, state, goal, settings,
     model_info) = values
    return SessionRow(
        id=sid, created_at=created, last_activity=activity, model=model, provider=provider,
        context_window=window, system_prompt=system, system_tokens=system_tokens, title=title,
        tags=msgspec.json.decode(tags), metadata=msgspec.json.decode(metadata), encoding=encoding,
        tokens_estimated=bool(estimated), message_count=count, token_count=tokens,
        context_tokens=context, last_seq=last_seq, stats=_stats_decoder.decode(stats),
        context_state=state.encode() if isinstance(state, str) else state,
        goal=_goal_decoder.decode(goal) if goal else None,
        settings=_settings_decoder.decode(settings), model_info=msgspec.json.decode(model_info),
    )


def insert_session(conn: sqlite3.Connection, row: SessionRow) -> SessionRow:
    try:
        conn.execute(
            f"INSERT INTO sessions ({COLUMNS}) VALUES ({', '.join('?' * 22)})",
            (row.id, row.created_at, row.last_activity, row.model, row.provider, row.context_window,
             row.system_prompt, row.system_tokens, row.title, _json.encode(row.tags).decode(),
             _json.encode(row.metadata).decode(), row.encoding, int(row.tokens_estimated), row.message_count,
             row.token_count, row.context_tokens, row.last_seq, _json.encode(row.stats).decode(),
             row.context_state.decode(), _json.encode(row.goal).decode() if row.goal else None,
             _json.encode(row.settings).decode(), _json.encode(row.model_info).decode()),
        )
    except conn.IntegrityError:  # (sqlite3's or psycopg's: both connections name theirs)
        raise CtxdError(ErrorCode.SessionExists, f"session {row.id!r} already exists",
                        {"field": "sessionId", "sessionId": row.id}) from None
    return row


def shown(conn: sqlite3.Connection) -> str:
    """A condition on ``sessions`` rows: not the session of an import still being written
    (SQLite's staged imports, ``store/messages.py``), which no reader may see before its
    last transaction. Always true on PostgreSQL, where an import is one transaction."""
    if is_postgres(conn):
        return "TRUE"
    return f"id NOT IN (SELECT session_id FROM unfinished_pushes WHERE after_seq = {IMPORTING})"


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRow | None:
    values = conn.execute(f"SELECT {COLUMNS} FROM sessions WHERE id = ? AND {shown(conn)}",
                          (session_id,)).fetchone()
    return _row(values) if values else None


def require_session(conn: sqlite3.Connection, session_id: str) -> SessionRow:
    row = get_session(conn, session_id)
    if row is None:
        raise session_not_found(session_id)
    return row


def list_sessions(conn: sqlite3.Connection, limit: int | None = None, tag: str | None = None) -> list[SessionRow]:
    sql = f"SELECT {COLUMNS} FROM sessions WHERE {shown(conn)}"
    args: list[Any] = []
    if tag is not None:
        elements = "json_array_elements_text(sessions.tags::json)" if is_postgres(conn) else "json_each(sessions.tags)"
        sql += f" AND EXISTS (SELECT 1 FROM {elements} WHERE value = ?)"
        args.append(tag)
    sql += " ORDER BY last_activity DESC, id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return [_row(v) for v in conn.execute(sql, args).fetchall()]


def count_sessions(conn: sqlite3.Connection) -> int:
    return conn.execute(f"SELECT count(*) FROM sessions WHERE {shown(conn)}").fetchone()[0]


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
    context_state: bytes | None = None,
) -> None:
    """A push's totals (and its active context's stored state, in the same statement: one
    rewrite of the row instead of two)."""
    args: tuple[Any, ...] = (last_activity, added_messages, added_tokens, context_tokens, last_seq,
                             _json.encode(stats).decode())
    if context_state is None:
        conn.execute(
            "UPDATE sessions SET last_activity = ?, message_count = message_count + ?, "
            "token_count = token_count + ?, context_tokens = ?, last_seq = ?, stats = ? WHERE id = ?",
            (*args, session_id))
    else:
        conn.execute(
            "UPDATE sessions SET last_activity = ?, message_count = message_count + ?, "
            "token_count = token_count + ?, context_tokens = ?, last_seq = ?, stats = ?, context_state = ? "
            "WHERE id = ?", (*args, context_state.decode(), session_id))


def last_seq_for_push(conn: sqlite3.Connection, session_id: str) -> int | None:
    """The session's newest seq, read where a push assigns the next ones. On PostgreSQL the
    row stays locked until the push's COMMIT, so a push through another daemon waits and
    then reads the seq this one wrote (SQLite has one writer: its transaction is the lock)."""
    if is_postgres(conn):
        row = conn.execute("SELECT last_seq FROM sessions WHERE id = ? FOR UPDATE", (session_id,)).fetchone()
    else:
        row = conn.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


@dataclass(slots=True)
class PushHead:
    """What a push reads before it writes (:func:`read_for_push`)."""

    last_seq: int
    context: tuple[bytes, Goal | None] | None
    """The stored context state and goal, when asked for."""
    seen: dict[str, tuple[int, int]]
    """Idempotency keys already stored: key -> (seq, tokens)."""


def read_for_push(conn: sqlite3.Connection, session_id: str, keys: list[str], *,
                  context: bool = False) -> PushHead | None:
    """A push's reads, sent together: the session's ``last_seq`` (on PostgreSQL with the row
    locked, :func:`last_seq_for_push`), with ``context`` its stored context state and goal
    (on shared storage, what the push compares with memory before it writes memory's copy
    over them), and which of ``keys`` are stored. Every statement is sent before any answer
    is read, so in PostgreSQL's pipeline mode (``dialect.pipeline_safe``) they cost one round
    trip. None if there is no such session."""
    columns = "last_seq, context_state, goal" if context else "last_seq"
    lock = " FOR UPDATE" if is_postgres(conn) else ""
    head = conn.execute(f"SELECT {columns} FROM sessions WHERE id = ?{lock}", (session_id,))
    # (Bounded by the committed last_seq read in the statement, which on PostgreSQL runs
    # after the row lock above was granted: the same bound as the seq just read.)
    seen = find_keys(conn, session_id, keys, committed=True) if keys else {}
    row = head.fetchone()
    if row is None:
        return None
    stored = None
    if context:
        state, goal = row[1], row[2]
        state = state.encode() if isinstance(state, str) else bytes(state)
        if goal is not None and not isinstance(goal, (str, bytes)):
            goal = _json.encode(goal)
        stored = (state, _goal_decoder.decode(goal) if goal else None)
    return PushHead(row[0], stored, seen)


_UNCHANGED: Any = object()


def _json_text(value: Any) -> str | None:
    return None if value is None else _json.encode(value).decode()


# Column -> how a Python value is stored in it.
_COLUMN_ENCODERS: dict[str, Any] = {
    "context_state": lambda v: v.decode(),
    "goal": _json_text,
    "settings": _json_text,
    "model_info": _json_text,
    "tags": _json_text,
    "metadata": _json_text,
}


def update_session(conn: sqlite3.Connection, session_id: str, **columns: Any) -> None:
    """Set the given columns of a session row (``_UNCHANGED`` values are skipped)."""
    values = {k: v for k, v in columns.items() if v is not _UNCHANGED}
    if not values:
        return
    args = [_COLUMN_ENCODERS.get(k, lambda x: x)(v) for k, v in values.items()]
    cursor = conn.execute(f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?",
                          (*args, session_id))
    if cursor.rowcount == 0:
        raise session_not_found(session_id)


def save_context(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    context_state: bytes | None = None,
    goal: Goal | None | bool = False,
    context_tokens: int | None = None,
) -> None:
    """Store what changed of a session's active context (``goal=False``: unchanged)."""
    update_session(conn, session_id,
                   context_state=_UNCHANGED if context_state is None else context_state,
                   goal=_UNCHANGED if goal is False else goal,
                   context_tokens=_UNCHANGED if context_tokens is None else context_tokens)


def update_metadata(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    title: str | None | bool = False,
    tags: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> None:
    """Descriptive fields (``title=False``: unchanged; ``None`` clears it)."""
    update_session(conn, session_id,
                   title=_UNCHANGED if title is False else title,
                   tags=_UNCHANGED if tags is None else tags,
                   metadata=_UNCHANGED if metadata is None else metadata)


# --- retention ---------------------------------------------------------------------------


def record_removal(conn: sqlite3.Connection, *, at: str, session_id: str, reason: str, detail: str,
                   title: str | None, message_count: int, last_activity: str | None) -> None:
    """Note a session retention removed (in the transaction that deletes it)."""
    conn.execute("INSERT INTO retention_removals (at, session_id, reason, detail, title, message_count, "
                 "last_activity) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (at, session_id, reason, detail, title, message_count, last_activity))


def removal_counts(conn: sqlite3.Connection) -> tuple[dict[str, int], str | None]:
    """Sessions retention removed, by reason, and when it last did."""
    rows = conn.execute("SELECT reason, count(*), max(at) FROM retention_removals GROUP BY reason").fetchall()
    return {reason: n for reason, n, _ in rows}, max((at for _, _, at in rows), default=None)


def retention_victims(conn: sqlite3.Connection, keep: int, older_than: str | None,
                      exclude: set[str]) -> list[tuple[str, str, str | None, int, str]]:
    """(id, reason, title, message_count, last_activity) of the sessions retention removes:
    those inactive since before ``older_than``, then the least recently active beyond the
    ``keep`` newest (0: no count limit). ``exclude`` is never removed, and counts as kept."""
    rows = conn.execute(f"SELECT id, title, message_count, last_activity FROM sessions WHERE {shown(conn)} "
                        "ORDER BY last_activity DESC, id").fetchall()
    out: list[tuple[str, str, str | None, int, str]] = []
    kept = 0
    for sid, title, messages, last in rows:
        if sid in exclude:
            kept += 1
            continue
        if older_than is not None and last < older_than:
            out.append((sid, "max_age", title, messages, last))
    aged = {sid for sid, *_ in out}
    if keep > 0:
        survivors = [r for r in rows if r[0] not in exclude and r[0] not in aged]
        for sid, title, messages, last in survivors[max(0, keep - kept):]:
            out.append((sid, "max_sessions", title, messages, last))
    return out


def active_since(conn: sqlite3.Connection, since: str) -> list[SessionRow]:
    """Sessions pushed to at or after ``since`` (an ISO timestamp as stored)."""
    return [_row(v) for v in conn.execute(f"SELECT {COLUMNS} FROM sessions WHERE last_activity >= ? "
                                          f"AND {shown(conn)} ORDER BY id", (since,)).fetchall()]
