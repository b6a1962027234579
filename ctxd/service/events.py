"""How the service tells the outside world what happened, without knowing about sockets.

The server implements :class:`EventSink` by sending notifications to the connections
subscribed to the session; tests and benchmarks can collect events in a list.
"""

from __future__ import annotations

from typing import Any, Protocol


class EventSink(Protocol):
    def emit(self, session_id: str, method: str, params: Any) -> None:
        """Deliver notification ``method`` about ``session_id`` to whoever listens."""


class Progress(Protocol):
    """Progress of one request (``$/progress`` on the requesting connection)."""

    def begin(self, title: str, message: str | None = None) -> None: ...

    def report(self, percentage: int, message: str | None = None) -> None: ...

    def end(self, message: str | None = None) -> None: ...


class NullEvents:
    def emit(self, session_id: str, method: str, params: Any) -> None:
        return None


class CollectingEvents:
    """Keeps every event, for tests and in-process use."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    def emit(self, session_id: str, method: str, params: Any) -> None:
        self.events.append((session_id, method, params))

    def of(self, method: str) -> list[Any]:
        return [p for _, m, p in self.events if m == method]


class NullProgress:
    def begin(self, title: str, message: str | None = None) -> None:
        return None

    def report(self, percentage: int, message: str | None = None) -> None:
        return None

    def end(self, message: str | None = None) -> None:
        return None
