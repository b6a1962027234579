"""What ``sessions.context_state`` (and a snapshot's ``state``) holds: the engine's
compression state plus the budget's figures, as stored.

The schema of stored state belongs to storage: the service keeps it in memory
(``service/state.py``), and ``ctxd-cli doctor`` checks and recovers stored rows against
it (``store/payloads.py``) without reaching up into the service.
"""

from __future__ import annotations

import msgspec

from ctxd.engine.context import CompressionState
from ctxd.tokens import PROMPT_PRIMING


class Figures(msgspec.Struct, rename="camel"):
    """The budget's inputs, kept on the row so no request needs the context loaded."""

    system: int = 0
    checkpoints: int = 0
    pinned: int = 0
    used: int = 0
    checkpoint_count: int = 0
    open_calls: list[str] | None = None
    """The conversation's tool calls without a result yet (``engine.render.Pairing``), so a
    push keeps ``used`` the rendered prompt's count without the context loaded; None in a
    row stored before it was kept (known again once the context is loaded)."""

    @property
    def prompt(self) -> int:
        return PROMPT_PRIMING + self.system + self.checkpoints + self.pinned + self.used


class StoredState(msgspec.Struct, rename="camel", omit_defaults=True):
    """``sessions.context_state``: the engine's state plus the figures."""

    compression: CompressionState = msgspec.field(default_factory=CompressionState)
    figures: Figures = msgspec.field(default_factory=Figures)


_stored_decoder = msgspec.json.Decoder(StoredState)


def decode_stored(data: bytes | None) -> StoredState:
    return _stored_decoder.decode(data or b"{}")
