"""Method table -> handlers: decode params against the method's Struct, call, return.

Handlers live in ``server/handlers/`` (one module per feature) and are thin: they
decode nothing themselves and decide nothing; the service does the work.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ctxd.config import Config
from ctxd.formats.native import accept_native_names
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import METHODS, MethodSpec
from ctxd.server.connection import Connection
from ctxd.server.handlers import HANDLERS

if TYPE_CHECKING:
    from ctxd.server.subscriptions import Hub
    from ctxd.service.core import Service

_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")


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

LSP_PARAMS = frozenset({"workDoneToken", "partialResultToken"})
"""Fields LSP lets any request carry; accepted (and ignored where unused) everywhere."""


@cache
def _param_names(params: type) -> frozenset[str]:
    return frozenset(f.encode_name for f in msgspec.structs.fields(params))


def decode_params(spec: MethodSpec, raw: Any) -> Any:
    """Params as the method's Struct, or a -32602 that names the field at fault."""
    if raw is None:
        if not spec.params_optional:
            raise CtxdError(ErrorCode.InvalidParams, f"Invalid params: {spec.name} requires params",
                            {"field": "params"})
        raw = {}
    if not isinstance(raw, dict):
        raise CtxdError(ErrorCode.InvalidParams,
                        f"Invalid params: {spec.name} takes an object, not {type(raw).__name__}",
                        {"field": "params"})
    if spec.name != "initialize":  # LSP clients send many initialize fields ctxd has no use for
        known = _param_names(spec.params)
        unknown = [k for k in raw if k not in known and k not in LSP_PARAMS]
        if unknown:
            raise CtxdError(ErrorCode.InvalidParams,
                            f"Invalid params: {spec.name} has no field {unknown[0]!r} "
                            f"(it takes {', '.join(sorted(known)) or 'no fields'})", {"field": unknown[0]})
    if spec.name == "session/push":
        accept_native_names(raw.get("messages"))
    elif spec.name == "context/prompt":
        accept_native_names(raw.get("push"))
    try:
        return msgspec.convert(raw, spec.params)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _AT.search(text)
        field = match.group(1) if match else ""
        if match:
            text = text[: match.start()] + (f" (at params.{field})" if field else "")
        missing = _MISSING.match(text)
        if missing:  # point at the missing field itself
            field = f"{field}.{missing.group(1)}" if field else missing.group(1)
        raise CtxdError(ErrorCode.InvalidParams, f"Invalid params: {text}",
                        {"field": field or "params"}) from None


def damaged_storage(config: Config, session_id: str | None, exc: BaseException) -> CtxdError:
    """Stored data ctxd cannot read: a StorageError that names the session and the way out."""
    where = f"session {session_id!r}" if isinstance(session_id, str) else "the database"
    return CtxdError(ErrorCode.StorageError,
                     f"stored data of {where} could not be read ({type(exc).__name__}: {exc}); the database "
                     f"file may be damaged: `ctxd-cli doctor` checks it and can recover what is readable "
                     f"into a new file", {"sessionId": session_id, "database": str(config.database_path)})


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
        try:
            return await handler(self._request(conn), params)
        except sqlite3.OperationalError as exc:  # busy, locked, out of disk: not damage
            raise CtxdError(ErrorCode.StorageError, f"the database could not be used: {exc}",
                            {"database": str(self.config.database_path)}) from exc
        except (msgspec.DecodeError, UnicodeDecodeError, sqlite3.DatabaseError) as exc:
            # The params were valid (decoded above), and handlers turn what they decode
            # from clients into their own errors: what failed to decode is stored data.
            raise damaged_storage(self.config, getattr(params, "session_id", None), exc) from exc
        except OverflowError as exc:  # a number the Structs do not bound, too big for SQLite
            raise CtxdError(ErrorCode.InvalidParams, f"Invalid params: a number is too large to store ({exc})",
                            {"field": "params"}) from exc
