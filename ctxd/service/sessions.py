"""Creating, listing, inspecting and deleting sessions."""

from __future__ import annotations

import uuid

from ctxd.protocol import notifications
from ctxd.protocol.errors import invalid_params
from ctxd.protocol.session import SessionCreateParams, SessionDeleteResult, SessionInfo, SessionListParams
from ctxd.service.clock import now_iso
from ctxd.service.core import Service
from ctxd.service.state import SessionState
from ctxd.store import sessions as store
from ctxd.store.sessions import SessionRow, SessionStats
from ctxd.tokens import PROMPT_PRIMING, TokenCounter

MAX_ID_LENGTH = 200


def session_info(svc: Service, state: SessionState) -> SessionInfo:
    row = state.row
    return SessionInfo(
        session_id=row.id, created_at=row.created_at, last_activity=row.last_activity,
        message_count=row.message_count, token_count=row.token_count,
        context_tokens=row.context_tokens, context_window=state.context_window,
        encoding=row.encoding, tokens_estimated=row.tokens_estimated, last_seq=row.last_seq,
        model=row.model, provider=row.provider, title=row.title, tags=row.tags,
        system_prompt=row.system_prompt, system_prompt_tokens=row.system_tokens, metadata=row.metadata,
    )


async def create_session(svc: Service, params: SessionCreateParams) -> SessionInfo:
    session_id = params.session_id if params.session_id is not None else str(uuid.uuid4())
    if not session_id.strip() or len(session_id) > MAX_ID_LENGTH:
        raise invalid_params(f"sessionId must be 1 to {MAX_ID_LENGTH} characters", "sessionId")
    if params.context_window is not None and params.context_window < 256:
        raise invalid_params("contextWindow must be at least 256 tokens", "contextWindow")
    counter = TokenCounter.for_model(params.model)
    system_tokens = counter.count_system(params.system_prompt or "")
    now = now_iso()
    row = SessionRow(
        id=session_id, created_at=now, last_activity=now, model=params.model, provider=params.provider,
        context_window=params.context_window, system_prompt=params.system_prompt,
        system_tokens=system_tokens, title=params.title, tags=params.tags or [],
        metadata=params.metadata or {}, encoding=counter.encoding, tokens_estimated=counter.estimated,
        message_count=0, token_count=0, context_tokens=PROMPT_PRIMING + system_tokens, last_seq=0,
        stats=SessionStats(),
    )
    await svc.db.write(store.insert_session, row)
    state = svc.cache.adopt(row)
    state.entries = []
    return session_info(svc, state)


async def get_session(svc: Service, session_id: str) -> SessionInfo:
    return session_info(svc, await svc.cache.get(session_id))


async def list_sessions(svc: Service, params: SessionListParams) -> list[SessionInfo]:
    if params.limit is not None and params.limit < 0:
        raise invalid_params("limit must not be negative", "limit")
    rows = await svc.db.read(store.list_sessions, params.limit, params.tag)
    # Cached states are authoritative for sessions being pushed to right now.
    return [session_info(svc, svc.cache.adopt(row)) for row in rows]


async def delete_session(svc: Service, session_id: str) -> SessionDeleteResult:
    state = await svc.cache.get(session_id)
    async with state.lock:
        deleted = await svc.db.write(store.delete_session, session_id)
        svc.cache.forget(session_id)
    svc.events.emit(session_id, "session/deleted", notifications.SessionDeleted(session_id=session_id))
    return SessionDeleteResult(session_id=session_id, deleted_messages=deleted)
