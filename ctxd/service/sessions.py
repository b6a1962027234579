"""Creating, listing, inspecting, updating and deleting sessions."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta

import msgspec

from ctxd.engine import calibration
from ctxd.protocol import notifications
from ctxd.protocol.common import MAX_NAME_CHARS, MAX_TITLE_CHARS
from ctxd.protocol.errors import CtxdError, ErrorCode, invalid_params
from ctxd.protocol.session import (
    RetentionSummary,
    SessionCreateParams,
    SessionDeleteResult,
    SessionInfo,
    SessionListParams,
    SessionUpdateParams,
)
from ctxd.service import compression, fields, notify
from ctxd.service.clock import now_iso, parse_iso
from ctxd.service.core import Service
from ctxd.service.state import SessionState, resolve_window
from ctxd.store import messages as message_store
from ctxd.store import sessions as store
from ctxd.store import snapshots as snapshot_store
from ctxd.store.sessions import SessionRow, SessionStats
from ctxd.tokens import PROMPT_PRIMING, TokenCounter

log = logging.getLogger(__name__)

MAX_ID_LENGTH = 200
MIN_WINDOW = 256


def session_info(svc: Service, state: SessionState) -> SessionInfo:
    row = state.row
    return SessionInfo(
        session_id=row.id, created_at=row.created_at, last_activity=row.last_activity,
        message_count=row.message_count, token_count=row.token_count,
        context_tokens=row.context_tokens, context_window=state.context_window,
        encoding=row.encoding, tokens_estimated=row.tokens_estimated, last_seq=row.last_seq,
        compression_count=state.cstate.compression_count, checkpoint_count=state.stored.figures.checkpoint_count,
        model=row.model, provider=row.provider, title=row.title, tags=row.tags,
        system_prompt=row.system_prompt, system_prompt_tokens=row.system_tokens, metadata=row.metadata,
        settings=row.settings, model_info=row.model_info,
    )


async def _model_info(svc: Service, params: SessionCreateParams) -> dict[str, object]:
    """Ask the backend about the model when the session does not give its window
    (Ollama ``/api/show``, an OpenAI-compatible ``/v1/models``)."""
    if not params.model or params.context_window is not None:
        return {}
    info = await svc.summarizers.model_info(params.model)
    if info is None:
        return {}
    out: dict[str, object] = {}
    if info.context_length:
        out["contextLength"] = info.context_length
    if info.parameter_size:
        out["parameterSize"] = info.parameter_size
    if info.output_limit:
        out["outputLimit"] = info.output_limit
    if info.family:
        out["family"] = info.family
    return out


async def create_session(svc: Service, params: SessionCreateParams) -> SessionInfo:
    session_id = params.session_id if params.session_id is not None else str(uuid.uuid4())
    if not session_id.strip() or len(session_id) > MAX_ID_LENGTH:
        raise invalid_params(f"sessionId must be 1 to {MAX_ID_LENGTH} characters", "sessionId")
    if params.context_window is not None and params.context_window < MIN_WINDOW:
        raise invalid_params(f"contextWindow must be at least {MIN_WINDOW} tokens", "contextWindow")
    fields.text(params.model, "model", MAX_NAME_CHARS)
    fields.text(params.provider, "provider", MAX_NAME_CHARS)
    _check_described(svc, params)
    if not svc.db.shared and svc.cache.holds(session_id):
        # Known without counting its system prompt (a proxy tries the create first); the
        # insert checks the rest (and on shared storage, another daemon may have deleted it).
        raise CtxdError(ErrorCode.SessionExists, f"session {session_id!r} already exists",
                        {"field": "sessionId", "sessionId": session_id})
    counter = TokenCounter.for_model(params.model)
    system_tokens = counter.count_system(params.system_prompt or "")
    now = now_iso()
    row = SessionRow(
        id=session_id, created_at=now, last_activity=now, model=params.model, provider=params.provider,
        context_window=params.context_window, system_prompt=params.system_prompt,
        system_tokens=system_tokens, title=params.title, tags=params.tags or [],
        metadata=params.metadata or {}, encoding=counter.encoding, tokens_estimated=counter.estimated,
        message_count=0, token_count=0, context_tokens=PROMPT_PRIMING + system_tokens, last_seq=0,
        stats=SessionStats(), model_info=await _model_info(svc, params),
    )
    if params.usage_samples:
        # Learned by another session of the same client and model (engine/calibration.py):
        # the newest few, as that session would keep them; pairs that teach nothing dropped.
        row.stats.drift.usage_samples = [
            (c, r) for c, r in params.usage_samples
            if calibration.teaches(c, r, params.context_window or 0)][-calibration.SAMPLES:]
    if params.settings is not None:
        row.settings = params.settings
    state = svc.cache.adopt_new(row)
    await svc.db.write(_insert_session, row, svc.db.dialect == "sqlite" and row.id not in svc.importing)
    svc.cache.register(state)
    svc.cache.context_of_new(state)
    removed = await enforce_retention(svc, exclude={state.id})
    info = session_info(svc, state)
    if removed:
        info.retention_removed = removed
    return info


async def count_sessions(svc: Service) -> int:
    """How many sessions a listing shows (``daemon/status``)."""
    return await svc.db.read(store.count_sessions)


async def get_session(svc: Service, session_id: str) -> SessionInfo:
    return session_info(svc, await svc.cache.current(session_id))


async def list_sessions(svc: Service, params: SessionListParams) -> list[SessionInfo]:
    if params.limit is not None and params.limit < 0:
        raise invalid_params("limit must not be negative", "limit")
    rows = await svc.db.read(store.list_sessions, params.limit, params.tag)
    # Cached states are authoritative for sessions being pushed to right now; on shared
    # storage, those another daemon changed meanwhile are read again.
    states = [svc.cache.adopt(row) for row in rows]
    if svc.db.shared:  # (a pass of this daemon mid-way leaves memory ahead, not behind)
        states = [svc.cache.adopt_new(row) if state.row is not row and not state.compress_lock.locked()
                  and svc.cache.moved(state, row) else state for state, row in zip(states, rows)]
    return [session_info(svc, state) for state in states]


def _check_described(svc: Service, params: SessionCreateParams | SessionUpdateParams) -> None:
    """The sizes of what ``session/create`` and ``session/update`` store (``fields``)."""
    if isinstance(params.title, str):
        fields.text(params.title, "title", MAX_TITLE_CHARS)
    fields.tags(params.tags)
    fields.metadata(params.metadata)
    fields.system_prompt(params.system_prompt, svc.config.limits.max_message_bytes)


async def update_session(svc: Service, params: SessionUpdateParams) -> SessionInfo:
    _check_described(svc, params)
    state = await svc.cache.get(params.session_id)
    if params.context_window is not None and params.context_window < MIN_WINDOW:
        raise invalid_params(f"contextWindow must be at least {MIN_WINDOW} tokens", "contextWindow")
    async with state.lock:
        row = state.row
        title = params.title if params.title is not msgspec.UNSET else False
        await svc.db.write(store.update_metadata, state.id, title=title, tags=params.tags, metadata=params.metadata)
        if title is not False:
            row.title = title  # type: ignore[assignment]
        if params.tags is not None:
            row.tags = params.tags
        if params.metadata is not None:
            row.metadata = params.metadata
        context_changed = False
        if params.settings is not None:
            given = {k: v for k, v in msgspec.structs.asdict(params.settings).items() if v is not None}
            row.settings = msgspec.structs.replace(row.settings, **given)
            context_changed = True
        if params.context_window is not None:
            row.context_window = params.context_window
            state.context_window, state.output_limit = resolve_window(row, svc.config)
            context_changed = True
        if params.system_prompt is not None:
            row.system_prompt = params.system_prompt or None
            row.system_tokens = state.counter.count_system(params.system_prompt)
            context_changed = True
        if context_changed:
            ctx = await svc.cache.context(state)
            ctx.system_prompt = row.system_prompt
            svc.cache.refresh(state, system=True)
            changes = {k: v for k, v in (("settings", msgspec.to_builtins(params.settings)),
                                          ("contextWindow", params.context_window),
                                          ("systemPromptChanged", params.system_prompt is not None or None))
                       if v is not None}
            encoded = state.encoded_state()

            def job(conn: object) -> None:
                store.update_session(conn, state.id, settings=row.settings,  # type: ignore[arg-type]
                                     context_window=row.context_window, system_prompt=row.system_prompt,
                                     system_tokens=row.system_tokens, context_state=encoded,
                                     context_tokens=row.context_tokens)
                # A mode transition (a model or settings change): recorded in the session's history.
                snapshot_store.add_event(conn, state.id, now_iso(), "settings", row.last_seq, changes)  # type: ignore[arg-type]

            await svc.db.write(job)
        budget = svc.cache.budget(state)
    notify.updated(svc, state, "updated")
    notify.after_change(svc, state, budget)
    if context_changed:
        compression.schedule(svc, state)
    return session_info(svc, state)


def _insert_session(conn: object, row: SessionRow, leftover: bool) -> None:
    """``leftover``: no import of this id runs now (SQLite: this daemon is its only
    writer), so a hidden unfinished import's session of that id is what a failed one left
    (its clean-up failed): it goes first."""
    if leftover:
        message_store.drop_import_leftover(conn, row.id)  # type: ignore[arg-type]
    store.insert_session(conn, row)  # type: ignore[arg-type]


async def delete_session(svc: Service, session_id: str, *, reason: str = "request", detail: str | None = None,
                         record: dict[str, object] | None = None) -> SessionDeleteResult:
    """Delete the session with its history, snapshots and everything else it owns, and
    say so to its subscribers. ``record``: retention's note of the removal, written in
    the same transaction (see ``enforce_retention``)."""
    state = await svc.cache.get(session_id)
    task = state.compression_task
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def job(conn: object) -> int:
        count = store.delete_session(conn, session_id)  # type: ignore[arg-type]
        if record is not None:
            store.record_removal(conn, **record)  # type: ignore[arg-type]
        return count

    async with state.compress_lock, state.lock:
        deleted = await svc.db.write(job)
        svc.cache.forget(session_id)
    svc.events.emit(session_id, notifications.SessionDeleted(session_id=session_id, reason=reason, detail=detail))  # type: ignore[arg-type]
    return SessionDeleteResult(session_id=session_id, deleted_messages=deleted)


def _victims(conn: object, keep: int, exclude: set[str]) -> list[str]:
    """Sessions beyond the ``keep`` most recently active (``exclude`` counts as kept)."""
    rows = conn.execute(f"SELECT id FROM sessions WHERE {store.shown(conn)} "  # type: ignore[attr-defined, arg-type]
                        "ORDER BY last_activity DESC, id").fetchall()
    ids = [sid for (sid,) in rows]
    kept = [sid for sid in ids if sid in exclude]
    others = [sid for sid in ids if sid not in exclude]
    return others[max(0, keep - len(kept)):]


async def delete_sessions(svc: Service, ids: list[str]) -> list[str]:
    deleted = []
    for session_id in ids:
        try:
            await delete_session(svc, session_id)
        except CtxdError as exc:
            if exc.code != ErrorCode.SessionNotFound:  # gone already: a concurrent delete
                raise
            continue
        deleted.append(session_id)
    return deleted


async def delete_beyond(svc: Service, keep: int, exclude: set[str] | None = None) -> list[str]:
    """Delete the least recently active sessions beyond the ``keep`` newest (``exclude``
    counts as kept), each with its history and snapshots."""
    return await delete_sessions(svc, await svc.db.read(_victims, keep, exclude or set()))


def _rule(reason: str, svc: Service) -> str:
    cfg = svc.config.sessions
    if reason == "max_age":
        return f"sessions.max_age_days = {cfg.max_age_days:g}"
    return f"sessions.max_sessions = {cfg.max_sessions}"


async def enforce_retention(svc: Service, exclude: set[str] | None = None) -> list[str]:
    """Apply ``sessions.max_age_days`` and ``sessions.max_sessions`` (0: off, the default).

    Every removal is announced: ``session/deleted`` with the rule as its reason, a
    WARNING log line (the default level), a row in ``retention_removals`` (what
    ``session/list`` counts), and to ``session/create``'s caller in its result."""
    cfg = svc.config.sessions
    if cfg.max_sessions <= 0 and cfg.max_age_days <= 0:
        return []
    now = now_iso()
    older_than = None
    if cfg.max_age_days > 0:
        older_than = (parse_iso(now) - timedelta(days=cfg.max_age_days)).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    victims = await svc.db.read(store.retention_victims, max(0, cfg.max_sessions), older_than, exclude or set())
    removed = []
    for session_id, reason, title, messages, last in victims:
        rule = _rule(reason, svc)
        why = (f"not active for more than {cfg.max_age_days:g} days" if reason == "max_age"
               else f"more than {cfg.max_sessions} sessions, and among the least recently active")
        detail = f"{rule}: {why} (last activity {last}, {messages} message{'' if messages == 1 else 's'})"
        record: dict[str, object] = {"at": now, "session_id": session_id, "reason": reason, "detail": rule,
                                     "title": title, "message_count": messages, "last_activity": last}
        try:
            await delete_session(svc, session_id, reason=reason, detail=detail, record=record)
        except CtxdError as exc:
            if exc.code != ErrorCode.SessionNotFound:  # gone already: a concurrent delete
                raise
            continue
        # At the default level: a removal nobody asked for right then must be seen.
        log.warning("retention removed session %r (%s): %s", session_id, title or "untitled", detail)
        removed.append(session_id)
    return removed


async def retention_summary(svc: Service) -> RetentionSummary:
    """What retention removed so far in this database, and how it is set."""
    by_reason, last = await svc.db.read(store.removal_counts)
    cfg = svc.config.sessions
    return RetentionSummary(removed=sum(by_reason.values()), by_reason=by_reason, last_removed_at=last,
                            max_sessions=max(0, cfg.max_sessions), max_age_days=max(0.0, cfg.max_age_days))
