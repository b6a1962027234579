"""The service port (``service/port.py``) served by a daemon over its socket, through
:class:`ctxd.client.Client`: the same Structs in and out as in process, the params
encoded once, the result decoded straight into its Struct.

The contract holds through the daemon connection: its requests run in the order sent
(one connection orders them, as the daemon does for any client), a refusal is the
daemon's :class:`~ctxd.protocol.errors.RpcError`, and a cancelled caller sends
``$/cancelRequest`` (withdrawn if its write has not started, else carried through)."""

from __future__ import annotations

import msgspec

from ctxd.client import Client
from ctxd.protocol.common import SessionRef
from ctxd.protocol.context import ContextStatsParams, ContextStatsResult, PromptParams, PromptResult
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
from ctxd.service.port import ServicePort


class RemotePort:
    """The port over one initialized daemon connection (its owner closes it)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def session_get(self, params: SessionRef) -> SessionInfo:
        return await self.client.request("session/get", params, result_type=SessionInfo)

    async def session_history(self, params: HistoryParams) -> HistoryResult:
        return await self.client.request("session/history", params, result_type=HistoryResult)

    async def session_create(self, params: SessionCreateParams) -> SessionInfo:
        return await self.client.request("session/create", params, result_type=SessionInfo)

    async def session_update(self, params: SessionUpdateParams) -> SessionInfo:
        return await self.client.request("session/update", params, result_type=SessionInfo)

    async def session_push(self, params: SessionPushParams) -> PushResult:
        return await self.client.request("session/push", params, result_type=PushResult)

    async def context_prompt(self, params: PromptParams) -> PromptResult:
        # (a union of the three formats' Structs, tagged by ``format``: converted here)
        return msgspec.convert(await self.client.request("context/prompt", params), PromptResult)

    async def session_list(self, params: SessionListParams) -> SessionListResult:
        return await self.client.request("session/list", params, result_type=SessionListResult)

    async def context_stats(self, params: ContextStatsParams) -> ContextStatsResult:
        return await self.client.request("context/stats", params, result_type=ContextStatsResult)


def _serves_the_port(port: RemotePort) -> ServicePort:
    return port  # (mypy checks here that RemotePort has every operation, typed alike)
