"""``$/progress`` for a request that carried a ``workDoneToken`` (LSP work-done progress)."""

from __future__ import annotations

from typing import Any

from ctxd.protocol.compression import ProgressBegin, ProgressEnd, ProgressParams, ProgressReport
from ctxd.server.connection import Connection


class WorkDoneProgress:
    """Sends begin/report/end for one token on the requesting connection."""

    def __init__(self, conn: Connection, token: Any) -> None:
        self.conn = conn
        self.token = token

    def begin(self, title: str, message: str | None = None) -> None:
        self.conn.notify(ProgressParams(self.token, ProgressBegin(title=title, message=message, percentage=0)))

    def report(self, percentage: int, message: str | None = None) -> None:
        self.conn.notify(ProgressParams(self.token, ProgressReport(message=message, percentage=percentage)))

    def end(self, message: str | None = None) -> None:
        self.conn.notify(ProgressParams(self.token, ProgressEnd(message=message)))
