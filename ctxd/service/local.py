"""The service port (``service/port.py``) served by the service in this process: what
``ctxd proxy`` calls when the daemon runs inside it (``proxy.in_process``). A call costs
no socket round trip: no JSON encoding of the request and of the whole prompt, no
wake-up of another process; the params and results are the protocol's Structs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from ctxd.protocol.common import SessionRef
from ctxd.protocol.context import ContextStatsParams, ContextStatsResult, PromptParams, PromptResult
from ctxd.protocol.errors import REQUEST_CANCELLED, CtxdError, ErrorCode, RpcError
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
from ctxd.service import history, ingest, prompt, sessions, stats
from ctxd.service.core import Service
from ctxd.service.errors import storage_errors
from ctxd.service.port import ServicePort, as_rpc_error

log = logging.getLogger(__name__)

R = TypeVar("R")


class LocalPort:
    """The port served by a :class:`Service` in this process."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._tails: dict[str, asyncio.Future[None]] = {}
        """Per session, done when its last request (and every one before) is over."""
        self._running: set[asyncio.Task[Any]] = set()

    async def session_get(self, params: SessionRef) -> SessionInfo:
        return await self._call(params, sessions.get_session(self.service, params.session_id))

    async def session_history(self, params: HistoryParams) -> HistoryResult:
        return await self._call(params, history.history(self.service, params))

    async def session_create(self, params: SessionCreateParams) -> SessionInfo:
        return await self._call(params, sessions.create_session(self.service, params))

    async def session_update(self, params: SessionUpdateParams) -> SessionInfo:
        return await self._call(params, sessions.update_session(self.service, params))

    async def session_push(self, params: SessionPushParams) -> PushResult:
        return await self._call(params, ingest.push(self.service, params))

    async def context_prompt(self, params: PromptParams) -> PromptResult:
        return await self._call(params, prompt.prompt(self.service, params))

    async def session_list(self, params: SessionListParams) -> SessionListResult:
        return await self._call(params, self._list(params))

    async def context_stats(self, params: ContextStatsParams) -> ContextStatsResult:
        return await self._call(params, stats.stats(self.service, params.session_id, params.format))

    async def _list(self, params: SessionListParams) -> SessionListResult:
        return SessionListResult(sessions=await sessions.list_sessions(self.service, params),
                                 retention=await sessions.retention_summary(self.service))

    def busy_sessions(self) -> list[str]:
        """Sessions with a request waiting or running (what the port keeps per session)."""
        return sorted(self._tails)

    async def _call(self, params: Any, work: Awaitable[R]) -> R:
        """Run ``work`` (the service's coroutine for ``params``) in its session's order, in
        a task of its own: the caller's cancellation reaches it only as a client's
        ``$/cancelRequest`` would."""
        session_id: str | None = getattr(params, "session_id", None)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        before: asyncio.Future[None] | None
        if isinstance(params, SessionListParams):  # after every request made before it; none waits for it
            key = ""
            before = _all_of(list(self._tails.values()))
        else:
            key = session_id or ""  # (a session/create without an id: those wait for each other)
            before = self._tails.get(key)
            self._tails[key] = done
        task = asyncio.get_running_loop().create_task(self._ordered(key, before, done, params, work))
        self._running.add(task)
        task.add_done_callback(self._finished)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.cancel(msg=REQUEST_CANCELLED)
            raise

    async def _ordered(self, key: str, before: asyncio.Future[None] | None, done: asyncio.Future[None],
                       params: Any, work: Awaitable[R]) -> R:
        try:
            if before is not None and not before.done():
                await asyncio.shield(before)  # (shielded: a withdrawn request leaves the one before alone)
            with storage_errors(self.service.config, params):
                return await work
        except CtxdError as exc:
            raise as_rpc_error(exc) from None
        except (asyncio.CancelledError, RpcError):
            raise
        except Exception as exc:  # what a socket client gets for a bug: an internal error, logged
            log.error("internal error in a request of session %r", key, exc_info=exc)
            raise RpcError(int(ErrorCode.InternalError), f"Internal error: {type(exc).__name__}: {exc}") from None
        finally:
            if asyncio.iscoroutine(work):
                work.close()  # (withdrawn before it began: never awaited)
            self._release(key, before, done)

    def _release(self, key: str, before: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
        """This request is over: the next of its session may run once every one before
        this has; the session's entry goes once nothing of it waits or runs."""
        def finish(_: Any = None) -> None:
            if not done.done():
                done.set_result(None)
            if self._tails.get(key) is done:
                del self._tails[key]

        if before is None or before.done():
            finish()
        else:
            before.add_done_callback(finish)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            task.exception()  # (retrieved even when the caller left: logged in _ordered if a bug)

    async def drain(self) -> None:
        """Before storage closes: requests not begun are withdrawn, writes begun finish."""
        for task in list(self._running):
            task.cancel(msg=REQUEST_CANCELLED)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


def _all_of(futures: list[asyncio.Future[None]]) -> asyncio.Future[None] | None:
    """Done once every one of ``futures`` is (None: nothing to wait for)."""
    pending = [f for f in futures if not f.done()]
    if not pending:
        return None
    everything: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = [len(pending)]

    def one_done(_: Any) -> None:
        left[0] -= 1
        if left[0] == 0 and not everything.done():
            everything.set_result(None)

    for future in pending:
        future.add_done_callback(one_done)
    return everything


def _serves_the_port(port: LocalPort) -> ServicePort:
    return port  # (mypy checks here that LocalPort has every operation, typed alike)
