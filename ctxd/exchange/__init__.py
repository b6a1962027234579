"""Session documents: export to and import from ctxd's JSON, OpenAI-chat JSONL and Markdown.

All three carry every message losslessly (the JSONL and Markdown forms embed the
original message wherever their own shape would lose something), so
``session/export`` then ``session/import`` gives back byte-equal content with the
same tool pairing, on any machine. All three carry the session's past too: its context
state (compression boundary, kept and pinned messages, watermark, prunes, excerpts,
rolled-back ranges), its checkpoints (active and merged away), the record of its
compressions and events, its snapshots and its calibration (``context``, see
``document.header``), so the imported session is the same session: the same statuses,
the same prompt. Pure functions of data: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctxd.protocol.message import Message


@dataclass(slots=True)
class ExportedMessage:
    seq: int
    created_at: str
    message: Message


@dataclass
class SessionDocument:
    """A session as documents carry it: descriptive fields, then history."""

    session_id: str
    created_at: str
    messages: list[ExportedMessage]
    title: str | None = None
    model: str | None = None
    provider: str | None = None
    context_window: int | None = None
    system_prompt: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    goal: dict[str, Any] | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    compressions: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] | None = None
    """The active context's state (``engine.context.CompressionState``); None in a document
    that does not carry one (a transcript, an export from before it was kept): the session
    then starts afresh from its history."""
    calibration: dict[str, Any] | None = None
    """What the session learned of its provider's count (``store.sessions.DriftTotals``)."""
    retired_checkpoints: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)


class DocumentError(ValueError):
    """The document is not a ctxd export (or is damaged); the message says where."""


FORMAT_NAME = "ctxd.session"
FORMAT_VERSION = 1
