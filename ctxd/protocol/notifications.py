"""Notifications the daemon sends to subscribed connections."""

from __future__ import annotations

from typing import Literal

import msgspec

UpdateReason = Literal["push", "compressed", "restored", "watermark", "pin", "goal", "updated", "supersede"]


class SessionUpdated(msgspec.Struct, rename="camel"):
    """``session/updated``: the session's history or active context changed."""

    session_id: str
    reason: UpdateReason
    last_seq: int
    message_count: int
    token_count: int
    context_tokens: int
    pushed: int = 0


DeleteReason = Literal["request", "max_sessions", "max_age"]


class SessionDeleted(msgspec.Struct, rename="camel"):
    """``session/deleted``: the session and everything it owned are gone.

    ``reason``: ``request`` (``session/delete``, ``session/cleanup``, ``session/clear``), or the
    retention rule that removed it: ``max_sessions`` (``sessions.max_sessions``) or ``max_age``
    (``sessions.max_age_days``); ``detail`` then says what was configured and how the session
    stood (its last activity, its message count)."""

    session_id: str
    reason: DeleteReason = "request"
    detail: str | None = None
