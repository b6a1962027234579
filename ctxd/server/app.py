"""Method table -> handlers: decode params against the method's Struct, call, return.

Handlers live in ``server/handlers/`` (one module per feature) and are thin: they
decode nothing themselves and decide nothing; the service does the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from ctxd.config import Config
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import METHODS, MethodSpec
from ctxd.server.connection import Connection
from ctxd.server.handlers import HANDLERS
from ctxd.service.errors import storage_errors
from ctxd.service.params import decode_params

if TYPE_CHECKING:
    from ctxd.server.subscriptions import Hub
    from ctxd.service.core import Service


class DaemonControl(Protocol):
    """What a handler may ask of the daemon process itself (``initialize``,
    ``daemon/status``, ``daemon/stop``); ``ctxd.daemon.Daemon`` provides it. Handlers get
    this, never the Daemon."""

    @property
    def started_at(self) -> str: ...

    @property
    def tcp_token(self) -> str:
        """The token a TCP client's ``initialize`` must carry."""
        ...

    def transport_names(self) -> list[str]: ...

    def watch_parent(self, pid: int) -> None:
        """Exit when process ``pid`` (the stdio client that spawned the daemon) is gone."""

    def stop_later(self) -> None:
        """Stop the daemon once the current answer has been written."""


@dataclass(slots=True)
class Request:
    """What a handler gets besides its params: its connection, and only the parts of the
    daemon handlers use."""

    conn: Connection
    service: Service
    hub: Hub
    config: Config
    control: DaemonControl
    msg_id: Any = None


OUT_OF_ORDER = frozenset({"context/compress", "session/import"})
"""Requests later ones from the same client do not wait for (they may take minutes)."""


class App:
    """Dispatches a connection's requests to the handlers, with what they need."""

    def __init__(self, config: Config, hub: Hub, control: DaemonControl) -> None:
        self.config = config
        self.hub = hub
        self.control = control
        self.service: Service | None = None
        """Set once storage is open (before any connection is accepted)."""
        missing = set(METHODS) - set(HANDLERS)
        if missing:
            raise RuntimeError(f"methods without a handler: {sorted(missing)}")

    def _request(self, conn: Connection) -> Request:
        service = self.service
        if service is None:
            raise CtxdError(ErrorCode.InternalError, "the daemon's storage is not open")
        return Request(conn, service, self.hub, self.config, self.control)

    def handlers_for(self, conn: Connection) -> dict[str, Callable[[Any], Awaitable[Any]]]:
        """Every method's handler for requests of ``conn`` (raw params in, result out)."""
        return {name: partial(self.dispatch, conn, spec, HANDLERS[name]) for name, spec in METHODS.items()}

    async def dispatch(self, conn: Connection, spec: MethodSpec, handler: Callable[..., Awaitable[Any]],
                       raw: Any) -> Any:
        if spec.name == "initialize":  # (the connection wakes what waits for it when it ends)
            return await handler(self._request(conn), decode_params(spec, raw))
        before, done = conn.order(spec.name not in OUT_OF_ORDER)
        try:
            await conn.ready(spec.name)
            if before is not None and not before.done():
                await asyncio.shield(before)  # (shielded: cancelling this must not cancel that)
            if conn.shutdown_requested:
                raise CtxdError(ErrorCode.InvalidRequest,
                                f"Invalid Request: {spec.name!r} after shutdown; only exit is accepted")
            return await self._run(conn, spec, handler, raw)
        finally:
            conn.release(before, done)

    async def _run(self, conn: Connection, spec: MethodSpec, handler: Callable[..., Awaitable[Any]],
                   raw: Any) -> Any:
        params = decode_params(spec, raw)
        with storage_errors(self.config, params):
            return await handler(self._request(conn), params)
