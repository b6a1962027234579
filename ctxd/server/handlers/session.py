"""``session/*`` handlers: decode, call the service, return."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.protocol.common import SessionRef
from ctxd.protocol.session import (
    PushResult,
    SessionCreateParams,
    SessionDeleteResult,
    SessionInfo,
    SessionListParams,
    SessionListResult,
    SessionPushParams,
    SessionUpdateParams,
    SubscribeParams,
    SubscribeResult,
)
from ctxd.server.handlers import handles
from ctxd.server.subscriptions import WILDCARD
from ctxd.service import ingest, sessions

if TYPE_CHECKING:
    from ctxd.server.app import Request


@handles("session/create")
async def create(req: Request, params: SessionCreateParams) -> SessionInfo:
    return await sessions.create_session(req.service, params)


@handles("session/list")
async def list_(req: Request, params: SessionListParams) -> SessionListResult:
    return SessionListResult(sessions=await sessions.list_sessions(req.service, params),
                             retention=await sessions.retention_summary(req.service))


@handles("session/get")
async def get(req: Request, params: SessionRef) -> SessionInfo:
    return await sessions.get_session(req.service, params.session_id)


@handles("session/delete")
async def delete(req: Request, params: SessionRef) -> SessionDeleteResult:
    return await sessions.delete_session(req.service, params.session_id)


@handles("session/update")
async def update(req: Request, params: SessionUpdateParams) -> SessionInfo:
    return await sessions.update_session(req.service, params)


@handles("session/push")
async def push(req: Request, params: SessionPushParams) -> PushResult:
    return await ingest.push(req.service, params)


@handles("session/subscribe")
async def subscribe(req: Request, params: SubscribeParams) -> SubscribeResult:
    if params.session_id != WILDCARD:
        await req.service.cache.get(params.session_id)  # SessionNotFound for a typo
    req.hub.subscribe(req.conn, params.session_id)
    return SubscribeResult(subscriptions=sorted(req.conn.subscriptions))


@handles("session/unsubscribe")
async def unsubscribe(req: Request, params: SubscribeParams) -> SubscribeResult:
    req.hub.unsubscribe(req.conn, params.session_id)
    return SubscribeResult(subscriptions=sorted(req.conn.subscriptions))
