"""Round trips for the provider-format tests: client messages read as the proxy reads them
(``ctxd.formats.to_ctxd``), decoded as the daemon decodes a push, and rendered back as
``context/prompt`` renders them."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd import formats
from ctxd.engine.render import RENDERERS, PromptPlan
from ctxd.formats.common import Api
from ctxd.protocol.message import Message


def stored(api: Api, raw: list[dict[str, Any]]) -> list[Message]:
    """The messages ctxd stores for a client's conversation (as the proxy pushes them)."""
    call_ids: dict[int, list[str]] = {}
    out = []
    for position, message in enumerate(raw):
        converted = formats.to_ctxd(api, message, call_ids=call_ids, position=position)
        if converted is not None:
            out.append(msgspec.convert(converted, Message))
    return out


def rendered(fmt: str, messages: list[Message], system: list[str] | None = None) -> Any:
    """What ``context/prompt`` answers for them in ``fmt`` (JSON)."""
    out = RENDERERS[fmt](PromptPlan(system_parts=system or [], messages=messages), lambda s: len(s) // 4)
    return msgspec.to_builtins(out.messages), out.system
