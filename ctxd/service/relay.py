"""Notifications across daemons on shared storage.

A client subscribed to a session on daemon A must hear about pushes, compressions and
snapshots done through daemon B. :class:`RelayedEvents` wraps the daemon's own sink:
every event goes to this daemon's subscribers as before and, through the store
(``Storage.publish``: LISTEN/NOTIFY on PostgreSQL), to the other daemons, which hand it
to theirs. Each daemon sends its events in the order it emitted them, and each is
emitted after the change was committed, so a session's notifications arrive in order.

What is published while a daemon's LISTEN connection is down never reaches it. Its
prompts never depended on notifications (a prompt first compares the stored session with
memory, ``SessionCache.catch_up``); its subscribers did: :func:`catch_up_after_gap`, run
once the connection is back, reloads every cached session another daemon changed and tells
the subscribers of every session changed meanwhile with one ``session/updated``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from ctxd.protocol.errors import CtxdError
from ctxd.protocol.methods import NOTIFICATIONS, notification_method
from ctxd.protocol.notifications import SessionUpdated
from ctxd.service.events import EventSink
from ctxd.store import sessions as session_store
from ctxd.store.backend import Storage

if TYPE_CHECKING:
    from ctxd.service.core import Service

log = logging.getLogger(__name__)


class _Envelope(msgspec.Struct):
    d: str
    """The daemon that emitted it (a daemon ignores its own)."""
    s: str
    m: str
    p: msgspec.Raw


_envelope = msgspec.json.Decoder(_Envelope)
_encode = msgspec.json.Encoder().encode


class RelayedEvents:
    """An :class:`EventSink` that also tells, and hears from, the other daemons."""

    def __init__(self, local: EventSink, db: Storage) -> None:
        self.local = local
        self.db = db
        self.daemon_id = uuid.uuid4().hex

    def emit(self, session_id: str, notification: Any) -> None:
        # (Forwarded by keyword: the relay builds no notification; tests/unit/test_method_table.py
        # checks each at the call that builds it.)
        self.local.emit(session_id, notification=notification)
        method = notification_method(notification)
        self.db.publish(_encode(_Envelope(self.daemon_id, session_id, method,
                                          msgspec.Raw(_encode(notification)))).decode())

    def received(self, message: str) -> None:
        """What another daemon published: to this daemon's subscribers of the session."""
        try:
            envelope = _envelope.decode(message)
            if envelope.d == self.daemon_id:
                return
            spec = NOTIFICATIONS[envelope.m]
            notification = msgspec.json.decode(envelope.p, type=spec.params)
        except (msgspec.DecodeError, KeyError) as exc:
            log.warning("a notification from another daemon could not be read: %s", exc)
            return
        self.local.emit(envelope.s, notification=notification)


async def catch_up_after_gap(svc: Service, since: float) -> None:
    """After notifications from other daemons may have been lost (since ``since``, a
    ``time.time()``): reload each cached session whose stored state moved on, and send this
    daemon's subscribers one ``session/updated`` for each session that did or was active."""
    started = datetime.fromtimestamp(since, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    changed: dict[str, Any] = {}
    for state in svc.cache.states():
        before = (state.row.last_seq, state.row.goal, state.stored.compression)
        try:
            await svc.cache.catch_up(state)
        except CtxdError:  # deleted meanwhile (forgotten by catch_up)
            continue
        if (state.row.last_seq, state.row.goal, state.stored.compression) != before:
            changed[state.id] = state.row
    for row in await svc.db.read(session_store.active_since, started):
        changed.setdefault(row.id, row)
    local = svc.relay.local if svc.relay is not None else svc.events
    for session_id, row in changed.items():
        local.emit(session_id, notification=SessionUpdated(
            session_id=session_id, reason="updated", last_seq=row.last_seq, message_count=row.message_count,
            token_count=row.token_count, context_tokens=row.context_tokens))


def resync_later(svc: Service) -> Any:
    """The ``resync`` callback for ``Storage.subscribe``: :func:`catch_up_after_gap` as a
    task of the service (cancelled when it closes)."""

    def resync(since: float) -> None:
        task = asyncio.get_running_loop().create_task(catch_up_after_gap(svc, since), name="ctxd-relay-resync")
        svc.tasks.add(task)
        task.add_done_callback(svc.tasks.discard)

    return resync
