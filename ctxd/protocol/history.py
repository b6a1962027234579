"""Full history, search, export/import and retention: what was pushed, never compressed."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ctxd.protocol.common import Seq
from ctxd.protocol.message import Message

ExportFormat = Literal["json", "markdown", "jsonl"]
ImportFormat = Literal["auto", "json", "markdown", "jsonl", "claude_code", "openai_chat", "aider", "mini_swe_agent",
                       "swe_agent", "openhands", "openhands_events", "locomo"]


class HistoryParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Page through a session's whole history: messages with ``seq >= from``."""

    session_id: str
    from_seq: Seq = msgspec.field(default=1, name="from")
    limit: int = 100


class HistoryEntry(msgspec.Struct, rename="camel", omit_defaults=True):
    seq: int
    created_at: str
    tokens: int
    message: Message
    status: Literal["context", "kept", "compressed", "rolled_back", "superseded"]
    """``context``: sent as is (maybe pruned/filtered); ``kept``: behind the compression
    boundary but sent verbatim (user words, pins); ``compressed``: stands in a checkpoint;
    ``rolled_back``: after a snapshot that was restored, no longer in the active context;
    ``superseded``: a client's working context it replaced with a newer copy
    (``context/prompt`` ``supersede``), no longer in the active context."""
    pruned: bool = False
    filtered: bool = False


class CompressionRecord(msgspec.Struct, rename="camel", omit_defaults=True):
    number: int
    at: str
    trigger: str
    last_seq: int
    """History's newest message when the pass ran (where it happened in the conversation)."""
    layers: list[str]
    before_tokens: int
    after_tokens: int
    checkpoint_ids: list[str]
    duration_ms: float
    summarizer: str | None = None
    detail: dict[str, Any] | None = None


class SessionEvent(msgspec.Struct, rename="camel", omit_defaults=True):
    """A transition that is not a message: a restore, a settings (mode) change."""

    at: str
    kind: str
    last_seq: int
    detail: dict[str, Any] | None = None


class HistoryResult(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    messages: list[HistoryEntry]
    next_seq: int | None
    """Pass as ``from`` for the next page; null at the end."""
    message_count: int
    model: str | None = None
    provider: str | None = None
    compressions: list[CompressionRecord] = []
    events: list[SessionEvent] = []


class SearchParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Full-text search (SQLite FTS5, ranked by bm25). Words are matched as words (all
    must appear); ``syntax: "fts"`` passes the query to FTS5 as is (phrases, OR, NEAR, prefix*)."""

    query: str
    session_id: str | None = None
    limit: int = 20
    role: Literal["system", "user", "assistant", "tool"] | None = None
    syntax: Literal["words", "fts"] = "words"


class SearchHit(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    seq: int
    role: str
    snippet: str
    score: float
    created_at: str
    title: str | None = None
    message: Message | None = None
    status: str | None = None


class SearchResult(msgspec.Struct, rename="camel"):
    query: str
    hits: list[SearchHit]
    took_ms: float


class HistorySearchParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Search one session and get the original messages back: what an agent calls to recall
    something that was summarized away."""

    session_id: str
    query: str
    limit: int = 10
    syntax: Literal["words", "fts"] = "words"


class ExportParams(msgspec.Struct, rename="camel"):
    """The session as a document (``json``: ctxd's own; ``jsonl``: OpenAI chat messages, one
    a line; ``markdown``: to read). Each carries every message and the session's past: its
    context state, checkpoints (active and merged away), goal, snapshots, the record of its
    compressions and events and its calibration; ``session/import`` of it gives the same
    session and the same prompt."""

    session_id: str
    format: ExportFormat = "json"


class ExportResult(msgspec.Struct, rename="camel"):
    session_id: str
    format: ExportFormat
    media_type: str
    filename: str
    document: str
    message_count: int


class ImportParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Create a session from a document: ctxd's json, jsonl or markdown exports, or any
    transcript format ctxd reads (Claude Code JSONL, OpenAI chat, agent trajectories)."""

    document: str
    format: ImportFormat = "auto"
    session_id: str | None = None
    title: str | None = None


class ImportResult(msgspec.Struct, rename="camel", omit_defaults=True):
    session_ids: list[str]
    message_count: int
    format: str
    warnings: list[str] = []


class CleanupParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Keep the ``keep`` most recently active sessions and delete the rest."""

    keep: int


class ClearParams(msgspec.Struct, rename="camel"):
    """Delete every session; ``all`` must be true (a guard against accidents)."""

    all: bool


class DeletedSessions(msgspec.Struct, rename="camel"):
    deleted: list[str]
