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

from ctxd.engine.context import ActiveContext, CompressionState, Entry, sent_tokens
from ctxd.engine.goals import render_goal
from ctxd.exchange import DocumentError, ExportedMessage, SessionDocument
from ctxd.protocol.compression import Checkpoint, SessionSettings
from ctxd.protocol.errors import CtxdError, ErrorCode, session_not_found
from ctxd.protocol.goal import Goal
from ctxd.protocol.history import (
    CompressionRecord,
    ExportParams,
    ExportResult,
    ImportParams,
    ImportResult,
    SessionEvent,
)
from ctxd.protocol.snapshot import SnapshotInfo
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
from ctxd.service.state import compression_policy
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store import snapshots as snapshot_store
from ctxd.store.messages import NewMessage
from ctxd.store.sessions import DriftTotals, SessionRow, SessionStats
from ctxd.store.state import Figures, StoredState, decode_stored
from ctxd.tokens import PROMPT_PRIMING, TokenCounter

MEDIA = {"json": "application/json", "jsonl": "application/jsonl", "markdown": "text/markdown"}
SUFFIX = {"json": "json", "jsonl": "jsonl", "markdown": "md"}
_encode = msgspec.json.Encoder().encode
log = logging.getLogger(__name__)


def _filename(doc: SessionDocument, fmt: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", (doc.title or doc.session_id))[:60].strip("-") or "session"
    return f"{base}.{SUFFIX[fmt]}"


def _read_past(conn: Any, session_id: str) -> tuple[SessionRow | None, list[Any], list[Checkpoint], list[Checkpoint],
                                                     list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    """Everything an export holds, read together: the row (its context state, goal and
    calibration), history, the checkpoints (active, merged away), the record of
    compressions and events, the snapshots."""
    return (session_store.get_session(conn, session_id), message_store.load_range(conn, session_id, 0, None, None),
            checkpoint_store.load_active(conn, session_id), checkpoint_store.load_retired(conn, session_id),
            checkpoint_store.list_compressions(conn, session_id), snapshot_store.list_events(conn, session_id),
            snapshot_store.list_rows(conn, session_id))


def _snapshot_doc(snapshot: snapshot_store.SnapshotRow) -> dict[str, Any]:
    return {"info": msgspec.to_builtins(snapshot.info), "state": msgspec.json.decode(snapshot.state),
            "checkpoints": msgspec.to_builtins(snapshot.checkpoints),
            "goal": msgspec.to_builtins(snapshot.goal) if snapshot.goal else None}


async def export(svc: Service, params: ExportParams) -> ExportResult:
    state = await svc.cache.get(params.session_id)
    # What is stored, read while no pass of this daemon is between its summaries and its
    # new state (a pass stores its state and checkpoints together).
    async with state.compress_lock:
        stored, rows, active, retired, compressions, events, snapshots = await svc.db.read(_read_past, state.id)
    if stored is None:
        svc.cache.forget(state.id)
        raise session_not_found(state.id)
    row = stored
    doc = SessionDocument(
        session_id=row.id, created_at=row.created_at,
        messages=[ExportedMessage(m.seq, m.created_at, m.message) for m in rows],
        title=row.title, model=row.model, provider=row.provider, context_window=row.context_window,
        system_prompt=row.system_prompt, tags=row.tags, metadata=row.metadata,
        settings=msgspec.to_builtins(row.settings), goal=msgspec.to_builtins(row.goal) if row.goal else None,
        checkpoints=[msgspec.to_builtins(cp) for cp in active], compressions=compressions, events=events,
        state=msgspec.to_builtins(decode_stored(row.context_state).compression),
        calibration=msgspec.to_builtins(row.stats.drift),
        retired_checkpoints=[msgspec.to_builtins(cp) for cp in retired],
        snapshots=[_snapshot_doc(snapshot) for snapshot in snapshots],
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
        transcripts = load_transcripts_from_bytes(text.encode("utf-8"), format=fmt, label="document")
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


@dataclasses.dataclass
class Past:
    """What a ctxd document carries of a session besides its history (``exchange``): its
    active context's state, checkpoints, the record of its passes and events, snapshots
    and calibration, checked against the history it comes with."""

    state: CompressionState
    checkpoints: list[Checkpoint]
    retired: list[Checkpoint]
    compressions: list[CompressionRecord]
    events: list[SessionEvent]
    snapshots: list[snapshot_store.SnapshotRow]
    drift: DriftTotals | None


def _bad(where: str, what: str) -> CtxdError:
    return CtxdError(ErrorCode.ImportFailed, f"document: {where}: {what}", {"field": "document"})


def _past_of(doc: SessionDocument, count: int) -> Past | None:
    """The document's past, or None when it carries none (the session starts afresh from
    its history). Every sequence number it names must be one of the document's messages,
    which must be numbered 1..N in order: the state refers to them by number."""
    if doc.state is None:
        return None
    for index, item in enumerate(doc.messages):
        if item.seq != index + 1:
            raise _bad(f"messages[{index}].seq", f"is {item.seq}, expected {index + 1} (the context state "
                                                 "refers to messages by their number)")
    try:
        state = msgspec.convert(doc.state, CompressionState)
        checkpoints = msgspec.convert(doc.checkpoints, list[Checkpoint])
        retired = msgspec.convert(doc.retired_checkpoints, list[Checkpoint])
        compressions = msgspec.convert(doc.compressions, list[CompressionRecord])
        events = msgspec.convert(doc.events, list[SessionEvent])
        drift = msgspec.convert(doc.calibration, DriftTotals) if doc.calibration is not None else None
    except msgspec.ValidationError as exc:
        raise _bad("its context", str(exc)) from None

    def within(where: str, seqs: Any, allow_zero: bool = False) -> None:
        for seq in seqs:
            if not isinstance(seq, int) or not (0 if allow_zero else 1) <= seq <= count:
                raise _bad(where, f"names message {seq}; the document has {count}")

    within("context.state.boundary", [state.boundary], allow_zero=True)
    within("context.state.keptSeqs", state.kept_seqs)
    if any(seq > state.boundary for seq in state.kept_seqs):
        raise _bad("context.state.keptSeqs", f"names a message after the boundary ({state.boundary})")
    within("context.state.pinned", state.pinned)
    within("context.state.watermarkSeq", [min(state.watermark_seq, count)], allow_zero=True)
    within("context.state.prunes", [p.through_seq for p in state.prunes], allow_zero=True)
    within("context.state.clips", [c.seq for c in state.clips])
    within("context.state.rolledBack", [seq for low, high in state.rolled_back for seq in (low, high)])
    for where, seqs in (("context.state.superseded", state.superseded), ("context.state.current", state.current)):
        within(where, seqs)
        if any(a >= b for a, b in zip(seqs, seqs[1:])):  # (looked up by bisection)
            raise _bad(where, "must name each message once, in increasing order")
    for cp in checkpoints + retired:
        within(f"checkpoint {cp.id}", [seq for low, high in cp.message_ranges for seq in (low, high)])
    snapshots = []
    for index, raw in enumerate(doc.snapshots):
        try:
            if not isinstance(raw, dict):
                raise msgspec.ValidationError("expected an object")
            info = msgspec.convert(raw.get("info"), SnapshotInfo)
            snap_state = msgspec.convert(raw.get("state") or {}, StoredState)
            snap_checkpoints = msgspec.convert(raw.get("checkpoints") or [], list[Checkpoint])
            snap_goal = msgspec.convert(raw["goal"], Goal) if raw.get("goal") else None
        except (msgspec.ValidationError, KeyError) as exc:
            raise _bad(f"context.snapshots[{index}]", str(exc)) from None
        within(f"snapshot {info.snapshot_id}", [info.last_seq], allow_zero=True)
        snapshots.append(snapshot_store.SnapshotRow(info, _encode(snap_state), snap_checkpoints, snap_goal))
    return Past(state, checkpoints, retired, compressions, events, snapshots, drift)


def _figures(svc: Service, row: SessionRow, past: Past, rows: list[tuple[int, NewMessage]],
             counter: TokenCounter) -> Figures:
    """The budget's figures of the imported session's active context, as the daemon will
    count it when it loads it (``SessionCache.context``)."""
    by_seq = {seq: new for seq, new in rows}
    cstate = past.state
    ctx = ActiveContext(
        system_prompt=row.system_prompt, state=msgspec.structs.replace(cstate), checkpoints=list(past.checkpoints),
        kept=[Entry.of(seq, by_seq[seq].message, by_seq[seq].tokens) for seq in cstate.kept_seqs],
        recent=[Entry.of(seq, new.message, new.tokens) for seq, new in rows
                if seq > cstate.boundary and not cstate.is_rolled_back(seq)])
    ctx.goal_text = render_goal(row.goal)
    ctx.refresh_system(counter.count)
    ctx.refresh(counter.count, compression_policy(svc.config, row).protected_tools)
    return Figures(ctx.system_tokens, ctx.checkpoint_tokens, ctx.pinned_tokens, ctx.used, len(ctx.checkpoints),
                   list(ctx.pairing.open))


def _write_past(conn: Any, session_id: str, past: Past | None) -> None:
    if past is None:
        return
    checkpoint_store.save_active(conn, session_id, past.checkpoints)
    checkpoint_store.save_retired(conn, session_id, past.retired)
    for record in past.compressions:
        checkpoint_store.insert_compression(conn, session_id, msgspec.to_builtins(record))
    for event in past.events:
        snapshot_store.add_event(conn, session_id, event.at, event.kind, event.last_seq, event.detail)
    for snapshot in past.snapshots:
        snapshot_store.insert_snapshot(conn, dataclasses.replace(
            snapshot, info=msgspec.structs.replace(snapshot.info, session_id=session_id)))


def _import_job(conn: Any, row: SessionRow, rows: list[tuple[int, NewMessage]], stored_state: bytes,
                past: Past | None = None) -> None:
    session_store.insert_session(conn, row)
    message_store.insert_messages(conn, row.id, rows)
    session_store.save_context(conn, row.id, context_state=stored_state)
    _write_past(conn, row.id, past)


def _begin_import(conn: Any, row: SessionRow) -> None:
    """A staged import's first transaction: its session with no messages yet (what
    ``ctxd-cli doctor`` finds consistent), hidden by its mark. What a failed import of
    the same id left (its clean-up failed too) goes first: no import of it runs now."""
    message_store.drop_import_leftover(conn, row.id)
    session_store.insert_session(conn, dataclasses.replace(row, message_count=0, token_count=0, last_seq=0))
    message_store.begin_staged(conn, row.id, message_store.IMPORTING, row.last_activity)


def _end_import(conn: Any, row: SessionRow, stored_state: bytes, past: Past | None = None) -> None:
    """Its last: the staged rows become the session's history, and the session is shown,
    exactly as :func:`_import_job` would have left it."""
    message_store.end_staged(conn, row.id)
    session_store.update_session(conn, row.id, message_count=row.message_count, token_count=row.token_count,
                                 last_seq=row.last_seq)
    session_store.save_context(conn, row.id, context_state=stored_state)
    _write_past(conn, row.id, past)


async def _write_staged(svc: Service, row: SessionRow, chunks: list[list[tuple[int, NewMessage]]],
                        stored_state: bytes, past: Past | None) -> None:
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
        await svc.db.write(_end_import, row, stored_state, past)
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
                        stored: StoredState, past: Past | None) -> None:
    """One conversation's session and messages, as one transaction or (SQLite, large) staged."""
    chunks = stage_chunks(rows) if svc.db.dialect == "sqlite" else []
    if len(chunks) > 1:
        # SQLite has one writer: an import's 10,000 rows in one transaction held every
        # other client's push 65-100 ms.
        await _write_staged(svc, row, chunks, _encode(stored), past)
    else:
        # An import larger than a small push (by count or by size) runs beside the
        # writer's other jobs where the store can (PostgreSQL's second writer connection):
        # its one transaction of 10,000 rows held every other client's push for ~230 ms,
        # and the COPY of 10 messages of 4 MB on the writer held them 240-920 ms.
        small = len(rows) <= PIPELINE_MESSAGES and sum(len(r.body) for _, r in rows) <= PIPELINE_BYTES
        write = svc.db.write if small else svc.db.write_apart
        await write(_import_job, row, rows, _encode(stored), past)


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
    planned: list[tuple[SessionRow, list[tuple[int, NewMessage]], StoredState, Past | None]] = []
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
        past = _past_of(doc, len(rows))
        if past is None:
            stored = StoredState(figures=Figures(system=system_tokens, used=used))
        else:  # the same session: its context as it was, and what it learned of its provider
            if past.drift is not None:
                row.stats.drift = past.drift
            stored = StoredState(compression=past.state, figures=_figures(svc, row, past, rows, counter))
            row.context_tokens = stored.figures.prompt
        row.context_state = _encode(stored)  # (what the cache adopts the session with)
        planned.append((row, rows, stored, past))
    written: list[str] = []
    try:
        for row, rows, stored, past in planned:
            await _write_import(svc, row, rows, stored, past)
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
    for row, rows, _, _ in planned:
        svc.indexer.stored(len(rows))
        state = svc.cache.adopt(row)
        ids.append(row.id)
        total += len(rows)
        compression.schedule(svc, state)
    await enforce_retention(svc, exclude=set(ids))
    return ImportResult(session_ids=ids, message_count=total, format=fmt, warnings=warnings[:50])
