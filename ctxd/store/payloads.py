"""What each JSON column of the database holds: the type the daemon decodes it into.

``ctxd-cli doctor`` checks every stored record against this (a page can be intact for
SQLite and still hold bytes that are not the record that was written), and recovery
keeps only the rows that decode. The Structs come from ``protocol/`` and ``store/``
(``store/state.py`` for a session's compression state), never from the service.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec


def payload_decoders() -> dict[str, dict[str, Callable[[Any], Any]]]:
    """table -> column -> a decoder raising on what the daemon could not read: each JSON
    column decoded into the type the daemon decodes it into (valid JSON of the wrong
    shape fails the daemon just the same). NULL passes where the column allows it."""
    from ctxd.protocol.compression import Checkpoint
    from ctxd.protocol.goal import Goal
    from ctxd.protocol.message import Message
    from ctxd.protocol.session import SessionSettings
    from ctxd.protocol.snapshot import SnapshotInfo
    from ctxd.store.sessions import SessionStats
    from ctxd.store.state import StoredState

    def typed(kind: Any, nullable: bool = False) -> Callable[[Any], Any]:
        decoder = msgspec.json.Decoder(kind)

        def decode(value: Any) -> Any:
            if value is None:
                if nullable:
                    return None
                raise ValueError("NULL")
            return decoder.decode(value)
        return decode

    return {
        "sessions": {"tags": typed(list[str]), "metadata": typed(dict[str, Any]), "stats": typed(SessionStats),
                     "context_state": typed(StoredState), "settings": typed(SessionSettings),
                     "model_info": typed(dict[str, Any]), "goal": typed(Goal, nullable=True)},
        "messages": {"body": typed(Message)},
        "checkpoints": {"body": typed(Checkpoint)},
        "compressions": {"layers": typed(list[str]), "checkpoint_ids": typed(list[str]),
                         "detail": typed(dict[str, Any], nullable=True)},
        "snapshots": {"info": typed(SnapshotInfo), "state": typed(StoredState),
                      "checkpoints": typed(list[Checkpoint]), "goal": typed(Goal, nullable=True)},
        "session_events": {"detail": typed(dict[str, Any], nullable=True)},
    }


PAYLOAD_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, ValueError, TypeError)


def decodes(decode: Callable[[Any], Any], value: Any) -> bool:
    try:
        decode(value)
    except PAYLOAD_ERRORS:
        return False
    return True
