"""The service port: what a front end that keeps sessions (``ctxd proxy``) asks of ctxd,
typed with the protocol's Structs (the one source of truth for the wire).

Two implementations, one contract:

* ``service/local.py``'s ``LocalPort``: the service in this process serves it directly:
  no connection, no JSON, the Structs the service returns;
* ``ctxd.remote_port.RemotePort``: a daemon over its socket (``ctxd.client``).

The contract, whichever serves it:

* this module imports only the protocol: a front end that talks to a daemon elsewhere
  loads none of the service;
* params are valid Structs (``service/params.py`` decodes plain data as the daemon does);
* a refusal raises :class:`~ctxd.protocol.errors.RpcError` with the code, message and
  data a socket client gets (storage's failures mapped by ``service/errors.py``);
* the requests of one session run in the order they were made, one after another (as
  on one daemon connection), those of other sessions alongside; a listing runs after
  every request made before it;
* a caller that is cancelled cancels its request as ``$/cancelRequest`` does: withdrawn
  if its write has not started, else carried through to the end (memory and storage
  alike) while the caller goes on.
"""

from __future__ import annotations

from typing import Protocol

from ctxd.protocol.common import SessionRef
from ctxd.protocol.context import ContextStatsParams, ContextStatsResult, PromptParams, PromptResult
from ctxd.protocol.errors import CtxdError, RpcError
from ctxd.protocol.history import HistoryParams, HistoryResult
from ctxd.protocol.session import (
    PushResult,
    SessionCreateParams,
    SessionInfo,
    SessionListParams,
    SessionListResult,
    SessionPushParams,
    SessionUpdateParams,
)


class ServicePort(Protocol):
    """The operations, named after their protocol methods."""

    async def session_get(self, params: SessionRef) -> SessionInfo:
        """``session/get``"""
        ...

    async def session_history(self, params: HistoryParams) -> HistoryResult:
        """``session/history``"""
        ...

    async def session_create(self, params: SessionCreateParams) -> SessionInfo:
        """``session/create``"""
        ...

    async def session_update(self, params: SessionUpdateParams) -> SessionInfo:
        """``session/update``"""
        ...

    async def session_push(self, params: SessionPushParams) -> PushResult:
        """``session/push``"""
        ...

    async def context_prompt(self, params: PromptParams) -> PromptResult:
        """``context/prompt``"""
        ...

    async def session_list(self, params: SessionListParams) -> SessionListResult:
        """``session/list``: it sees every request made before it, of any session."""
        ...

    async def context_stats(self, params: ContextStatsParams) -> ContextStatsResult:
        """``context/stats``"""
        ...


PORT_METHODS: dict[str, str] = {
    "session/get": "session_get",
    "session/history": "session_history",
    "session/create": "session_create",
    "session/update": "session_update",
    "session/push": "session_push",
    "context/prompt": "context_prompt",
    "session/list": "session_list",
    "context/stats": "context_stats",
}
"""Protocol method -> the port's operation."""


def as_rpc_error(exc: CtxdError) -> RpcError:
    """A service error as a caller of the port sees it (what a socket client is answered)."""
    return RpcError(int(exc.code), exc.message, exc.data)
