"""``session/*``: create, list, inspect, delete sessions and push messages into them."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.protocol.common import UsageCount, WindowSize
from ctxd.protocol.compression import SessionSettings
from ctxd.protocol.context import Budget
from ctxd.protocol.message import Message


class SessionCreateParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Create a session. The server makes an id when ``sessionId`` is absent.

    ``contextWindow`` overrides what ctxd would infer from the model; ``systemPrompt``
    is never compressed and counts against every prompt's budget.
    """

    session_id: str | None = None
    model: str | None = None
    provider: str | None = None
    context_window: WindowSize | None = None
    system_prompt: str | None = None
    title: str | None = None
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    settings: SessionSettings | None = None
    usage_samples: list[tuple[UsageCount, UsageCount]] | None = None
    """(ctxd's count, provider's count) pairs learned elsewhere (``context/stats``
    ``usageDrift.samples`` of another session of the same client and model): the budget's
    calibration starts from them instead of from nothing, so the first prompts already
    leave room for what the provider counts beside the messages (tool definitions)."""


class SessionUpdateParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Change a session's descriptive fields or settings; fields left out stay as they are
    (``settings`` is merged field by field). ``title: null`` clears the title."""

    session_id: str
    title: str | None | msgspec.UnsetType = msgspec.UNSET
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    settings: SessionSettings | None = None
    context_window: WindowSize | None = None
    system_prompt: str | None = None


class SessionInfo(msgspec.Struct, rename="camel", omit_defaults=True):
    """A session and its running totals (kept up to date on every push, never recomputed)."""

    session_id: str
    created_at: str
    last_activity: str
    message_count: int
    token_count: int
    context_tokens: int
    context_window: int
    encoding: str
    tokens_estimated: bool
    last_seq: int
    compression_count: int = 0
    checkpoint_count: int = 0
    model: str | None = None
    provider: str | None = None
    title: str | None = None
    tags: list[str] = []
    system_prompt: str | None = None
    system_prompt_tokens: int = 0
    metadata: dict[str, Any] = {}
    settings: SessionSettings = msgspec.field(default_factory=SessionSettings)
    model_info: dict[str, Any] = {}
    retention_removed: list[str] = []
    """``session/create`` only: the sessions retention removed to make room for this one
    (``sessions.max_sessions``), least recently active first; each was also announced
    with ``session/deleted``."""


class SessionListParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """List sessions, most recently active first."""

    limit: int | None = None
    tag: str | None = None


class RetentionSummary(msgspec.Struct, rename="camel"):
    """What automatic retention did to this database's sessions, and what it is set to.

    ``removed`` counts every session retention ever deleted (never ``session/delete`` or
    cleanup on request), ``byReason`` splits it by rule (``max_sessions``, ``max_age``);
    ``maxSessions``/``maxAgeDays`` are the current settings (0: off)."""

    removed: int = 0
    by_reason: dict[str, int] = {}
    last_removed_at: str | None = None
    max_sessions: int = 0
    max_age_days: float = 0


class SessionListResult(msgspec.Struct, rename="camel"):
    sessions: list[SessionInfo]
    retention: RetentionSummary = msgspec.field(default_factory=RetentionSummary)


class SessionDeleteResult(msgspec.Struct, rename="camel"):
    session_id: str
    deleted_messages: int


class SessionPushParams(msgspec.Struct, rename="camel"):
    """Append messages to a session, in order, atomically (all or none are stored)."""

    session_id: str
    messages: list[Message]


class PushedMessage(msgspec.Struct, rename="camel"):
    """Where one pushed message landed; ``duplicate`` means its idempotency key was seen before."""

    seq: int
    tokens: int
    duplicate: bool = False


class PushResult(msgspec.Struct, rename="camel"):
    session_id: str
    messages: list[PushedMessage]
    message_count: int
    token_count: int
    context_tokens: int
    tokens_estimated: bool
    budget: Budget
    append_room: int = 0
    """As ``context/prompt``'s: how far the conversation can grow in pushes with no pass able
    to start and the prompt still fitting (0 while a pass is running or due)."""


class SubscribeParams(msgspec.Struct, rename="camel"):
    """Receive this session's notifications on this connection (``"*"``: every session)."""

    session_id: str


class SubscribeResult(msgspec.Struct, rename="camel"):
    subscriptions: list[str]
