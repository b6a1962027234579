"""Notifications the daemon sends to subscribed connections."""

from __future__ import annotations

from typing import Literal

import msgspec

UpdateReason = Literal["push", "compressed", "restored", "watermark", "pin", "goal", "updated"]


class SessionUpdated(msgspec.Struct, rename="camel"):
    """``session/updated``: the session's history or active context changed."""

    session_id: str
    reason: UpdateReason
    last_seq: int
    message_count: int
    token_count: int
    context_tokens: int
    pushed: int = 0


class SessionDeleted(msgspec.Struct, rename="camel"):
    """``session/deleted``: the session and everything it owned are gone."""

    session_id: str
