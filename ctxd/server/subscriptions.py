"""Who listens to which session, and delivery of notifications to them.

The hub is the service's :class:`~ctxd.service.events.EventSink`: a notification is
encoded once and written to every connection subscribed to its session (or to
``"*"``). Writing never blocks the service; a connection that stopped reading is
dropped by its writer, not waited for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.protocol.methods import notification_method
from ctxd.server.connection import Connection

WILDCARD = "*"
_encode = msgspec.json.Encoder().encode


def frame(method: str, params: Any) -> bytes:
    body = _encode({"jsonrpc": "2.0", "method": method, "params": params})
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


class Hub:
    def __init__(self) -> None:
        self.connections: set[Connection] = set()
        self._listeners: dict[str, set[Connection]] = {}
        self._watchers: list[Callable[[str, Any], None]] = []

    def watch(self, watcher: Callable[[str, Any], None]) -> Callable[[], None]:
        """Have ``watcher(session_id, notification)`` called for every notification, in
        this process, as it is emitted (a proxy in the daemon's process learns at once
        that a session changed); returns what stops it. A watcher must not block or raise."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher) if watcher in self._watchers else None

    def add(self, conn: Connection) -> None:
        self.connections.add(conn)

    def remove(self, conn: Connection) -> None:
        self.connections.discard(conn)
        for session_id in conn.subscriptions:
            listeners = self._listeners.get(session_id)
            if listeners is not None:
                listeners.discard(conn)
                if not listeners:
                    del self._listeners[session_id]
        conn.subscriptions.clear()

    def subscribe(self, conn: Connection, session_id: str) -> None:
        conn.subscriptions.add(session_id)
        self._listeners.setdefault(session_id, set()).add(conn)

    def unsubscribe(self, conn: Connection, session_id: str) -> None:
        conn.subscriptions.discard(session_id)
        listeners = self._listeners.get(session_id)
        if listeners is not None:
            listeners.discard(conn)
            if not listeners:
                del self._listeners[session_id]

    def listeners(self, session_id: str) -> set[Connection]:
        return self._listeners.get(session_id, set()) | self._listeners.get(WILDCARD, set())

    def emit(self, session_id: str, notification: Any) -> None:
        method = notification_method(notification)
        for watcher in self._watchers:
            watcher(session_id, notification)
        targets = self.listeners(session_id)
        if not targets:
            return
        data = frame(method, notification)
        for conn in targets:
            if not conn.closed.is_set():
                conn.send_frame(data)
