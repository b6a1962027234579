"""``session/export`` and ``session/import``: moving a session between machines.

Import is all or nothing: every message is validated and counted first, then the
session and its whole history are written in one transaction; or, a large import on
SQLite, *staged* as a large push is (``service/ingest.py``): the session row first, with
no messages and marked unfinished, which hides it from every reader; its rows in
transactions of at most ``ingest.STAGE_CHUNK_ROWS``, above its ``last_seq`` of 0; then a
last small transaction gives it its history and totals and removes the mark. An import
that fails, or a daemon killed meanwhile, leaves nothing (``store/messages.py``,
``drop_unfinished``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from ctxd.engine.context import sent_tokens
from ctxd.exchange import DocumentError, ExportedMessage, SessionDocument
from ctxd.protocol.compression import SessionSettings
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.goal import Goal
from ctxd.protocol.history import ExportParams, ExportResult, ImportParams, ImportResult
from ctxd.service import compression, turns
from ctxd.service.clock import now_iso
from ctxd.service.core import Service
from ctxd.service.ingest import (
    PIPELINE_BYTES,
    PIPELINE_MESSAGES,
    THREAD_COUNT_BYTES,
    _add_stats,
    _title_of,
    check_message,
    stage_chunks,
    write_stages,
)
from ctxd.service.sessions import MIN_WINDOW, enforce_retention
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store import snapshots as snapshot_store
from ctxd.store.messages import NewMessage
from ctxd.store.sessions import SessionRow, SessionStats
from ctxd.store.state import Figures, StoredState
from ctxd.tokens import PROMPT_PRIMING, TokenCounter

MEDIA = {"json": "application/json", "jsonl": "application/jsonl", "markdown": "text/markdown"}
SUFFIX = {"json": "json", "jsonl": "jsonl", "markdown": "md"}
_encode = msgspec.json.Encoder().encode
log = logging.getLogger(__name__)


def _filename(doc: SessionDocument, fmt: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", (doc.title or doc.session_id))[:60].strip("-") or "session"
    return f"{base}.{SUFFIX[fmt]}"


async def export(svc: Service, params: ExportParams) -> ExportResult:
    state = await svc.cache.current(params.session_id)
    rows = await svc.db.read(message_store.load_range, state.id, 0, None, None)
    active = await svc.db.read(checkpoint_store.load_active, state.id)
    compressions = await svc.db.read(checkpoint_store.list_compressions, state.id)
    events = await svc.db.read(snapshot_store.list_events, state.id)
    row = state.row
    doc = SessionDocument(
        session_id=row.id, created_at=row.created_at,
        messages=[ExportedMessage(m.seq, m.created_at, m.message) for m in rows],
        title=row.title, model=row.model, provider=row.provider, context_window=row.context_window,
        system_prompt=row.system_prompt, tags=row.tags, metadata=row.metadata,
        settings=msgspec.to_builtins(row.settings), goal=msgspec.to_builtins(row.goal) if row.goal else None,
        checkpoints=[msgspec.to_builtins(cp) for cp in active], compressions=compressions, events=events,
    )
    # The document formats load on first use, not at daemon start-up.
    from ctxd.exchange.document import export_json
    from ctxd.exchange.jsonl import export_jsonl
    from ctxd.exchange.markdown import export_markdown

    now = now_iso()
    if params.format == "markdown":
        document = export_markdown(doc, now)
    elif params.format == "jsonl":
        document = export_jsonl(doc)
    else:
        document = export_json(doc, now)
    return ExportResult(session_id=row.id, format=params.format, media_type=MEDIA[params.format],
                        filename=_filename(doc, params.format), document=document, message_count=len(rows))


PAUSE_SECONDS = 0.003
"""After reading a large document's frame, the loop lets other clients' requests run this
long before the import goes on."""
STEP_SECONDS = 0.002
"""Preparing an import's messages (in a thread) calls ``between`` after about this much work."""


def too_many(count: int, limit: int) -> CtxdError:
    """An import over ``limits.max_batch_messages``: refused like a push, with the figures."""
    return CtxdError(ErrorCode.BatchTooLarge,
                     f"document: {count} messages; the limit is {limit} (limits.max_batch_messages, as for a push)",
                     {"field": "document", "count": count, "limit": limit})


def _parse(params: ImportParams, max_messages: int,
           between: Callable[[], object] | None = None) -> tuple[list[SessionDocument], str, list[str]]:
    """The document's conversations; run in a thread, calling ``between`` (the daemon's
    ``Turns.step_aside_and_rest``) between pieces of a ctxd JSON export's scan and decode. A
    ctxd JSON export is counted before any message is decoded, so an oversized one is
    refused for the price of a scan."""
    from ctxd.exchange.document import import_outline, outline_json
    from ctxd.exchange.jsonl import import_jsonl, is_ctxd_jsonl
    from ctxd.exchange.markdown import import_markdown, is_ctxd_markdown
    from ctxd.importers import TranscriptError, load_transcripts_from_bytes

    text = params.document
    fmt: str = params.format
    if fmt == "auto":
        stripped = text.lstrip()
        if stripped.startswith("{") and '"format": "ctxd.session"' in stripped[:200] or \
                stripped.startswith('{"format":"ctxd.session"'):
            fmt = "json"
        elif is_ctxd_jsonl(text):
            fmt = "jsonl"
        elif is_ctxd_markdown(text):
            fmt = "markdown"
    try:
        if fmt == "json":
            outline = outline_json(text, between)
            if len(outline.messages) > max_messages:
                raise too_many(len(outline.messages), max_messages)
            return [import_outline(outline, between)], fmt, []
        if fmt == "jsonl":
            return [import_jsonl(text)], fmt, []
        if fmt == "markdown":
            return [import_markdown(text)], fmt, []
    except (DocumentError, ValueError) as exc:
        raise CtxdError(ErrorCode.ImportFailed, f"document ({fmt}): {exc}", {"field": "document"}) from None
    try:
        transcripts = load_transcripts_from_bytes(text.encode("utf-8"), format=fmt, name="document")
    except TranscriptError as exc:
        raise CtxdError(ErrorCode.ImportFailed, str(exc), {"field": "document"}) from None
    docs, warnings = [], []
    for t in transcripts:
        docs.append(SessionDocument(
            session_id="", created_at="", messages=[ExportedMessage(i + 1, "", m) for i, m in enumerate(t.messages)],
            title=t.title, model=t.model, provider=t.provider, system_prompt=t.system_prompt,
            metadata={"importedFrom": t.source_format}))
        warnings += t.warnings
        fmt = t.source_format
    return docs, fmt, warnings


def _prepare(doc: SessionDocument, counter: TokenCounter, limit: int, now: str,
             between: Callable[[], object]) -> tuple[list[tuple[int, NewMessage]], SessionStats, int, int]:
    """(In a thread.) Each message of ``doc`` validated, encoded as it will be stored and
    counted, with the session's stats: (its rows by seq, stats, context tokens used, system
    tokens).
    ``between`` (the daemon's ``Turns.step_aside_and_rest``) runs every ``STEP_SECONDS`` or
    so: on the event loop, in 10 ms slices with 3 ms pauses, a 10,000-message import held
    other clients' pushes 110-250 ms on PostgreSQL."""
    rows: list[tuple[int, NewMessage]] = []
    stats = SessionStats()
    used = 0
    system_tokens = counter.count_system(doc.system_prompt or "")
    stepped = time.perf_counter()
    for index, item in enumerate(doc.messages):
        if time.perf_counter() - stepped > STEP_SECONDS:
            between()
            stepped = time.perf_counter()
        message = msgspec.structs.replace(item.message, idempotency_key=None)
        try:
            check_message(message, index)
        except CtxdError as exc:
            raise CtxdError(ErrorCode.ImportFailed, f"document: {exc.message}", exc.data) from None
        body = _encode(message)
        if len(body) > limit:
            raise CtxdError(ErrorCode.MessageTooLarge, f"document: message {index + 1} is {len(body)} bytes; "
                            f"the limit is {limit} (limits.max_message_bytes, as for a push)",
                            {"field": f"messages[{index}]", "size": len(body), "limit": limit})
        tokens = counter.count_message(message)
        before = PROMPT_PRIMING + system_tokens + used  # (an import is sent whole: prompt == history)
        _add_stats(stats, message, tokens, before, before, doc.context_window or 0)
        used += sent_tokens(message, tokens)
        rows.append((index + 1, NewMessage(message, body, tokens, None, item.created_at or now)))
    return rows, stats, used, system_tokens


def _import_job(conn: Any, row: SessionRow, rows: list[tuple[int, NewMessage]], stored_state: bytes) -> None:
    session_store.insert_session(conn, row)
    message_store.insert_messages(conn, row.id, rows)
    session_store.save_context(conn, row.id, context_state=stored_state)


def _begin_import(conn: Any, row: SessionRow) -> None:
    """A staged import's first transaction: its session with no messages yet (what
    ``ctxd-cli doctor`` finds consistent), hidden by its mark. What a failed import of
    the same id left (its clean-up failed too) goes first: no import of it runs now."""
    message_store.drop_import_leftover(conn, row.id)
    session_store.insert_session(conn, dataclasses.replace(row, message_count=0, token_count=0, last_seq=0))
    message_store.begin_staged(conn, row.id, message_store.IMPORTING, row.last_activity)


def _end_import(conn: Any, row: SessionRow, stored_state: bytes) -> None:
    """Its last: the staged rows become the session's history, and the session is shown,
    exactly as :func:`_import_job` would have left it."""
    message_store.end_staged(conn, row.id)
    session_store.update_session(conn, row.id, message_count=row.message_count, token_count=row.token_count,
                                 last_seq=row.last_seq)
    session_store.save_context(conn, row.id, context_state=stored_state)


async def _write_staged(svc: Service, row: SessionRow, chunks: list[list[tuple[int, NewMessage]]],
                        stored_state: bytes) -> None:
    """A large import on SQLite in several transactions (the module doc)."""
    # Before the try: if this fails (the id is taken), nothing of ours was written, and the
    # clean-up must not touch what another write of that id marked. (A shutdown cancelling
    # it once committed leaves the hidden session to the next start's clean-up.)
    if row.id in svc.importing:
        raise CtxdError(ErrorCode.SessionExists, f"session {row.id!r} already exists (being imported)",
                        {"field": "sessionId", "sessionId": row.id})
    svc.importing.add(row.id)
    try:
        await svc.db.write(_begin_import, row)
    except BaseException:
        svc.importing.discard(row.id)
        raise
    count = sum(len(chunk) for chunk in chunks)
    svc.indexer.unfinished += count
    try:
        await write_stages(svc, row.id, chunks)
        await svc.db.write(_end_import, row, stored_state)
    except BaseException:
        try:  # nothing of it was acknowledged: it goes now (else when the id is taken again, or at the next start)
            await svc.db.write(message_store.drop_unfinished, row.id)
        except Exception as exc:
            log.warning("session %s: a failed import stays, hidden, until its id is taken again or the daemon "
                        "next starts (%s)", row.id, exc)
        raise
    finally:
        svc.indexer.unfinished -= count
        svc.importing.discard(row.id)


async def _write_import(svc: Service, row: SessionRow, rows: list[tuple[int, NewMessage]],
                        stored: StoredState) -> None:
    """One conversation's session and messages, as one transaction or (SQLite, large) staged."""
    chunks = stage_chunks(rows) if svc.db.dialect == "sqlite" else []
    if len(chunks) > 1:
        # SQLite has one writer: an import's 10,000 rows in one transaction held every
        # other client's push 65-100 ms.
        await _write_staged(svc, row, chunks, _encode(stored))
    else:
        # An import larger than a small push (by count or by size) runs beside the
        # writer's other jobs where the store can (PostgreSQL's second writer connection):
        # its one transaction of 10,000 rows held every other client's push for ~230 ms,
        # and the COPY of 10 messages of 4 MB on the writer held them 240-920 ms.
        small = len(rows) <= PIPELINE_MESSAGES and sum(len(r.body) for _, r in rows) <= PIPELINE_BYTES
        write = svc.db.write if small else svc.db.write_apart
        await write(_import_job, row, rows, _encode(stored))


async def import_session(svc: Service, params: ImportParams) -> ImportResult:
    max_messages = svc.config.limits.max_batch_messages
    if len(params.document) > THREAD_COUNT_BYTES:
        # Reading the frame just held the loop: other clients' requests go first, then the
        # scan (which holds the interpreter while it runs, thread or not).
        await anyio.sleep(PAUSE_SECONDS)
    # Decoding a large document on the event loop would stall every other client; in a
    # thread, it steps aside while their requests run.
    turns.TURNS.mark_heavy()
    docs, fmt, warnings = await anyio.to_thread.run_sync(_parse, params, max_messages,
                                                         turns.TURNS.step_aside_and_rest)
    count = sum(len(doc.messages) for doc in docs)
    if count > max_messages:
        raise too_many(count, max_messages)
    if params.session_id is not None and len(docs) > 1:
        raise CtxdError(ErrorCode.InvalidParams, f"the document holds {len(docs)} conversations; "
                        "sessionId can name only one", {"field": "sessionId"})
    # All or nothing: every conversation is prepared (and refused, if it must be) before
    # any is written, and those written are removed if a later one cannot be.
    limit = svc.config.limits.max_message_bytes
    planned: list[tuple[SessionRow, list[tuple[int, NewMessage]], StoredState]] = []
    for doc in docs:
        session_id = params.session_id or doc.session_id or str(uuid.uuid4())
        counter = TokenCounter.for_model(doc.model)
        now = now_iso()
        rows, stats, used, system_tokens = await anyio.to_thread.run_sync(
            _prepare, doc, counter, limit, now, turns.TURNS.step_aside_and_rest)
        window = doc.context_window if doc.context_window and doc.context_window >= MIN_WINDOW else None
        try:
            goal = msgspec.convert(doc.goal, Goal) if doc.goal else None
            settings = msgspec.convert(doc.settings, SessionSettings) if doc.settings else SessionSettings()
        except msgspec.ValidationError as exc:
            raise CtxdError(ErrorCode.ImportFailed, f"document: its goal or settings are not valid: {exc}",
                            {"field": "document"}) from None
        first_user = next((r.message for _, r in rows if _title_of(r.message)), None)
        title = params.title or doc.title
        if title is None and first_user is not None:
            title = _title_of(first_user)
        row = SessionRow(
            id=session_id, created_at=doc.created_at or now, last_activity=now, model=doc.model,
            provider=doc.provider, context_window=window, system_prompt=doc.system_prompt,
            system_tokens=system_tokens, title=title, tags=doc.tags, metadata=doc.metadata,
            encoding=counter.encoding, tokens_estimated=counter.estimated, message_count=len(rows),
            token_count=sum(r.tokens.total for _, r in rows), context_tokens=PROMPT_PRIMING + system_tokens + used,
            last_seq=len(rows), stats=stats, goal=goal, settings=settings,
        )
        planned.append((row, rows, StoredState(figures=Figures(system=system_tokens, used=used))))
    written: list[str] = []
    try:
        for row, rows, stored in planned:
            await _write_import(svc, row, rows, stored)
            written.append(row.id)
    except BaseException:
        for session_id in written:
            try:
                await svc.db.write(session_store.delete_session, session_id)
            except Exception as exc:  # (shown, as any imported session, for the user to delete)
                log.warning("session %s: imported before a later conversation of the document failed, and could "
                            "not be removed again (%s)", session_id, exc)
        raise
    ids: list[str] = []
    total = 0
    for row, rows, _ in planned:
        svc.indexer.stored(len(rows))
        state = svc.cache.adopt(row)
        ids.append(row.id)
        total += len(rows)
        compression.schedule(svc, state)
    await enforce_retention(svc, exclude=set(ids))
    return ImportResult(session_ids=ids, message_count=total, format=fmt, warnings=warnings[:50])
