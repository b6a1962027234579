"""``session/history``, searches, export/import and retention handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.protocol.history import (
    CleanupParams,
    ClearParams,
    DeletedSessions,
    ExportParams,
    ExportResult,
    HistoryParams,
    HistoryResult,
    HistorySearchParams,
    ImportParams,
    ImportResult,
    SearchParams,
    SearchResult,
)
from ctxd.server.handlers import handles
from ctxd.service import history, retention, transfer

if TYPE_CHECKING:
    from ctxd.server.app import Request


@handles("session/history")
async def session_history(req: Request, params: HistoryParams) -> HistoryResult:
    return await history.history(req.service, params)


@handles("session/search")
async def search(req: Request, params: SearchParams) -> SearchResult:
    return await history.search(req.service, params)


@handles("history/search")
async def history_search(req: Request, params: HistorySearchParams) -> SearchResult:
    return await history.history_search(req.service, params)


@handles("session/export")
async def export(req: Request, params: ExportParams) -> ExportResult:
    return await transfer.export(req.service, params)


@handles("session/import")
async def import_(req: Request, params: ImportParams) -> ImportResult:
    return await transfer.import_session(req.service, params)


@handles("session/cleanup")
async def cleanup(req: Request, params: CleanupParams) -> DeletedSessions:
    return await retention.cleanup(req.service, params)


@handles("session/clear")
async def clear(req: Request, params: ClearParams) -> DeletedSessions:
    return await retention.clear(req.service, params)
