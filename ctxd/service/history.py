"""Full history and search: ``session/history``, ``session/search``, ``history/search``.

History is every message as pushed, whatever compression did to the active context
(compression changes what is sent, never what is stored); each entry says where it stands now (sent, kept
verbatim behind the boundary, compressed into a checkpoint, or rolled back by a
restore).
"""

from __future__ import annotations

import time

import msgspec

from ctxd.engine.context import CompressionState
from ctxd.protocol.errors import invalid_params
from ctxd.protocol.history import (
    CompressionRecord,
    HistoryEntry,
    HistoryParams,
    HistoryResult,
    HistorySearchParams,
    SearchHit,
    SearchParams,
    SearchResult,
    SessionEvent,
)
from ctxd.service.core import Service
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import search as search_store
from ctxd.store import snapshots as snapshot_store
from ctxd.store.messages import StoredMessage

MAX_PAGE = 1000
MAX_HITS = 200


def status_of(cstate: CompressionState, seq: int) -> str:
    if cstate.is_rolled_back(seq):
        return "rolled_back"
    if cstate.is_superseded(seq):
        return "superseded"
    if seq <= cstate.boundary:
        return "kept" if seq in cstate.kept_seqs else "compressed"
    return "context"


def _entry(cstate: CompressionState, m: StoredMessage) -> HistoryEntry:
    status = status_of(cstate, m.seq)
    has_tools = m.tokens.tool_call > 0 or m.tokens.tool_result > 0
    return HistoryEntry(
        seq=m.seq, created_at=m.created_at, tokens=m.tokens.total, message=m.message, status=status,  # type: ignore[arg-type]
        pruned=status == "context" and m.tokens.tool_result > 0 and m.seq <= cstate.prune_horizon()
        and m.seq not in cstate.pinned,
        filtered=status == "context" and has_tools and m.seq < cstate.watermark_seq and m.seq not in cstate.pinned,
    )


async def history(svc: Service, params: HistoryParams) -> HistoryResult:
    if not 1 <= params.limit <= MAX_PAGE:
        raise invalid_params(f"limit must be 1 to {MAX_PAGE}", "limit")
    if params.from_seq < 1:
        raise invalid_params("from must be at least 1", "from")
    state = await svc.cache.current(params.session_id)  # (each message's status: from what is stored)
    rows = await svc.db.read(message_store.load_range, state.id, params.from_seq - 1, None, params.limit + 1)
    more = len(rows) > params.limit
    rows = rows[: params.limit]
    cstate = state.cstate
    first = params.from_seq == 1
    compressions = [msgspec.convert(c, CompressionRecord) for c in
                    await svc.db.read(checkpoint_store.list_compressions, state.id)] if first else []
    events = [msgspec.convert(e, SessionEvent) for e in
              await svc.db.read(snapshot_store.list_events, state.id)] if first else []
    return HistoryResult(
        session_id=state.id, messages=[_entry(cstate, m) for m in rows],
        next_seq=rows[-1].seq + 1 if more and rows else None, message_count=state.row.message_count,
        model=state.row.model, provider=state.row.provider, compressions=compressions, events=events,
    )


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_HITS:
        raise invalid_params(f"limit must be 1 to {MAX_HITS}", "limit")
    return limit


def _query(text: str, syntax: str) -> str:
    try:
        return search_store.fts_query(text, syntax)
    except search_store.QueryError as exc:
        raise invalid_params(f"query: {exc}", "query") from None


async def _run(svc: Service, query: str, **kwargs: object) -> list[search_store.Hit]:
    await svc.indexer.catch_up()
    kwargs["unfinished"] = svc.indexer.unfinished  # (rows of pushes being written: ranked, then dropped)
    try:
        return await svc.db.read(lambda conn: search_store.search(conn, query, **kwargs))  # type: ignore[arg-type]
    except search_store.QueryError as exc:
        raise invalid_params(f"query: {exc}", "query") from None


async def search(svc: Service, params: SearchParams) -> SearchResult:
    """Ranked hits across all sessions (or one), with snippets."""
    started = time.perf_counter()
    limit = _limit(params.limit)
    query = _query(params.query, params.syntax)
    if params.session_id is not None:
        await svc.cache.get(params.session_id)
    hits = await _run(svc, query, session_id=params.session_id, role=params.role, limit=limit)
    return SearchResult(query=params.query, took_ms=round((time.perf_counter() - started) * 1000, 3), hits=[
        SearchHit(session_id=h.session_id, seq=h.seq, role=h.role, snippet=h.snippet, score=h.score,
                  created_at=h.created_at, title=h.title) for h in hits])


async def history_search(svc: Service, params: HistorySearchParams) -> SearchResult:
    """Within one session, with the original messages: recall what was summarized away."""
    started = time.perf_counter()
    limit = _limit(params.limit)
    query = _query(params.query, params.syntax)
    state = await svc.cache.current(params.session_id)
    hits = await _run(svc, query, session_id=state.id, limit=limit, with_body=True)
    cstate = state.cstate
    return SearchResult(query=params.query, took_ms=round((time.perf_counter() - started) * 1000, 3), hits=[
        SearchHit(session_id=h.session_id, seq=h.seq, role=h.role, snippet=h.snippet, score=h.score,
                  created_at=h.created_at, title=h.title, message=h.message(), status=status_of(cstate, h.seq))
        for h in hits])
