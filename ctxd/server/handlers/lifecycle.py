"""``initialize``, ``shutdown``, ``daemon/status``, ``daemon/stop``."""

from __future__ import annotations

import hmac
import os
import time
from typing import TYPE_CHECKING

from ctxd import __version__
from ctxd.protocol.common import Empty
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.lifecycle import (
    DaemonStatusResult,
    InitializeParams,
    InitializeResult,
    ServerCapabilities,
    ServerInfo,
)
from ctxd.protocol.methods import METHODS, NOTIFICATIONS
from ctxd.server.handlers import handles
from ctxd.service.sessions import count_sessions

if TYPE_CHECKING:
    from ctxd.server.app import Request

PROTOCOL_VERSION = "1"


@handles("initialize")
async def initialize(req: Request, params: InitializeParams) -> InitializeResult:
    conn = req.conn
    if conn.requires_token:
        given = (params.initialization_options.token if params.initialization_options else None) or ""
        if not hmac.compare_digest(given.encode(), req.control.tcp_token.encode()):
            # Not call_soon(conn.close): that would run before this error is written.
            conn.close_after_reply = True
            raise CtxdError(ErrorCode.Unauthorized,
                            "initializationOptions.token is missing or wrong; read it from the daemon's token file",
                            {"field": "initializationOptions.token"})
    conn.initialized = True
    conn.client_name = params.client_info.name if params.client_info else None
    if params.process_id is not None and conn.transport == "stdio":
        req.control.watch_parent(params.process_id)
    return InitializeResult(
        server_info=ServerInfo(name="ctxd", version=__version__),
        capabilities=ServerCapabilities(
            methods=sorted(METHODS),
            notifications=sorted(n.name for n in NOTIFICATIONS.values() if n.direction == "server->client"),
            prompt_formats=["openai", "anthropic", "ollama"],
            protocol_version=PROTOCOL_VERSION,
        ),
    )


@handles("shutdown")
async def shutdown(req: Request, params: Empty) -> None:
    req.conn.shutdown_requested = True
    return None


@handles("daemon/status")
async def status(req: Request, params: Empty) -> DaemonStatusResult:
    svc, config, control = req.service, req.config, req.control
    return DaemonStatusResult(
        pid=os.getpid(), version=__version__, started_at=control.started_at,
        uptime_seconds=round(time.time() - svc.started, 3), data_dir=str(config.data_dir),
        database=config.database, transports=control.transport_names(),
        connections=len(req.hub.connections), sessions=await count_sessions(svc),
        durability=config.storage.durability, summarizer=svc.summarizers.name,
    )


@handles("daemon/stop")
async def stop(req: Request, params: Empty) -> None:
    req.control.stop_later()
    return None


