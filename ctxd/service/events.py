"""How the service tells the outside world what happened, without knowing about sockets.

The server implements :class:`EventSink` by sending notifications to the connections
subscribed to the session; tests and benchmarks can collect events in a list.
"""

from __future__ import annotations

from typing import Any, Protocol

from ctxd.protocol.methods import notification_method


class EventSink(Protocol):
    def emit(self, session_id: str, notification: Any) -> None:
        """Deliver ``notification`` about ``session_id`` to whoever listens. It is the params
        Struct of a notification in ``ctxd.protocol.methods`` (``SessionUpdated(...)``),
        which names its method (:func:`~ctxd.protocol.methods.notification_method`)."""


class Progress(Protocol):
    """Progress of one request (``$/progress`` on the requesting connection)."""

    def begin(self, title: str, message: str | None = None) -> None: ...

    def report(self, percentage: int, message: str | None = None) -> None: ...

    def end(self, message: str | None = None) -> None: ...


class NullEvents:
    def emit(self, session_id: str, notification: Any) -> None:
        notification_method(notification)  # (what any sink would refuse, refused here too)


class CollectingEvents:
    """Keeps every event as ``(session_id, method, params)``, for tests and in-process use."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    def emit(self, session_id: str, notification: Any) -> None:
        self.events.append((session_id, notification_method(notification), notification))

    def of(self, kind: str | type, session_id: str | None = None) -> list[Any]:
        """The params of every event of ``kind`` (a method, or a params Struct class), in order;
        of one session's only, given ``session_id``."""
        return [p for s, m, p in self.events
                if (m == kind if isinstance(kind, str) else isinstance(p, kind))
                and (session_id is None or s == session_id)]

    def methods(self, session_id: str | None = None) -> list[str]:
        """The methods of the events, in order (of one session's, given ``session_id``)."""
        return [m for s, m, _ in self.events if session_id is None or s == session_id]

    def clear(self) -> None:
        self.events.clear()


class NullProgress:
    def begin(self, title: str, message: str | None = None) -> None:
        return None

    def report(self, percentage: int, message: str | None = None) -> None:
        return None

    def end(self, message: str | None = None) -> None:
        return None
