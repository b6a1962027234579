"""The proxy's link to a daemon inside its own process (``proxy.in_process``, docs/proxy.md).

When no daemon answers on the socket, the proxy does not start one apart: the daemon
(its storage, its socket for ctxd-cli, editors and ``ctxd mcp``) runs on the proxy's
event loop, and the proxy calls its service through the service port
(``service/port.py``), with no socket round trip. The proxy does not know how that
daemon is made: its entry point (``ctxd proxy``, ``ctxd/__main__.py``) hands it an
:data:`OpenHere` (``ctxd/embed.py``); this package imports nothing of the daemon.

What the socket path gives is kept, by the port's contract and here:

* the same validation and the same errors: the params are decoded as the daemon decodes
  them (``service/params.py``), refusals are :class:`ctxd.client.RpcError` as the socket
  client raises them, and results are the same plain data;
* requests of one session run in the order they were made, those of other sessions
  alongside; a cancelled caller's request is withdrawn if its write has not started,
  else carried through to the end (the port's contract);
* one daemon per socket: the daemon takes the socket's lock before it opens storage;
  when another process holds it, the proxy connects to that daemon (:class:`NotHere`);
* shutdown: the proxy drains its reply pushes first, then the daemon stops as it does
  on SIGTERM; ``daemon/stop`` from a socket client stops the proxy too (``wait_stopped``).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Awaitable, Callable
from itertools import compress, count
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ctxd.config import Config
from ctxd.protocol.errors import CtxdError, ErrorCode, RpcError
from ctxd.protocol.methods import METHODS
from ctxd.service.params import decode_params
from ctxd.service.port import PORT_METHODS, ServicePort, as_rpc_error

log = logging.getLogger("ctxd.proxy")

REMEMBERED_PROMPTS = 64
"""Sessions whose last prompt is kept (``_prompt_builtins``), the most recent."""

PROXY_METHODS = frozenset(PORT_METHODS)
"""What the proxy asks of the daemon: the service port's operations."""


class DaemonHere(Protocol):
    """A daemon running in this process: the port its service serves, and its lifetime."""

    @property
    def port(self) -> ServicePort: ...

    def watch(self, watcher: Callable[[str, Any], None]) -> Callable[[], None] | None:
        """Call ``watcher(session_id, notification)`` for every notification the daemon
        emits, as it does; returns what stops it. None: the daemon cannot tell every change
        as it happens (its storage is shared with other daemons)."""

    async def wait_stopped(self) -> None:
        """Until the daemon is asked to stop (``daemon/stop`` from a socket client)."""

    async def close(self) -> None:
        """The daemon's stop path: requests in flight finished, connections closed, storage closed."""


class NotHere(Exception):
    """No daemon in this process. ``socket``: the socket of the daemon to use instead (the
    one that took this socket first, or the one whose data directory this is); None: the
    daemon could not start (the message says why)."""

    def __init__(self, message: str, socket: Path | None = None) -> None:
        super().__init__(message)
        self.socket = socket


OpenHere = Callable[[Config], Awaitable[DaemonHere]]
"""Starts the daemon in this process (its socket and storage), or raises :class:`NotHere`."""


class PortLink:
    """The proxy's daemon link (``DaemonLink``'s interface: plain data in and out) over
    the service port of a daemon in this process."""

    def __init__(self, here: DaemonHere) -> None:
        self.here = here
        self.port = here.port
        self._prompts: dict[tuple[str, Any], tuple[list[Any], list[Any]]] = {}
        """The last prompt per session and format: its message objects and their plain data."""

    async def start(self) -> None:
        return None

    def watch(self, watcher: Callable[[str, Any], None]) -> Callable[[], None] | None:
        """The daemon's notifications as they are emitted (``Sessions`` learns that a
        session changed besides its pushes: a goal set, a pass, a pin), or None."""
        return self.here.watch(watcher)

    async def request(self, session_id: str, method: str, params: Any) -> Any:
        """``method`` as the daemon runs it for a socket client, its result as the client
        would decode it (plain dicts and lists), its error as :class:`RpcError`."""
        operation = PORT_METHODS.get(method)
        if operation is None:
            raise ValueError(f"{method!r} is not served in process")
        try:
            typed = decode_params(METHODS[method], params)
        except CtxdError as exc:
            raise as_rpc_error(exc) from None
        result = await getattr(self.port, operation)(typed)
        try:
            if method == "context/prompt":
                return self._prompt_builtins(session_id, params, result)
            return msgspec.to_builtins(result)
        except (TypeError, msgspec.EncodeError) as exc:  # (a bug: as the socket answers a result it cannot encode)
            log.error("cannot convert the result of %s: %s", method, exc)
            raise RpcError(int(ErrorCode.InternalError), f"cannot encode result: {exc}") from None

    def _prompt_builtins(self, session_id: str, params: Any, result: Any) -> dict[str, Any]:
        """A prompt as plain data, its messages converted only from the first that is not
        the same object as in the last prompt of the session and format: between
        compressions the daemon's renderer hands out the same message objects for what it
        rendered before (``engine/render.py``), so a turn converts only its new messages.
        The plain messages are shared with the previous result (the proxy never changes
        them in place)."""
        messages = result.messages
        key = (session_id, params.get("format") if isinstance(params, dict) else None)
        last = self._prompts.pop(key, None)
        if last is not None and last[0]:
            # (The first index where they differ, in one pass in C.)
            kept = next(compress(count(), map(operator.is_not, last[0], messages)), min(len(last[0]), len(messages)))
            plain = last[1][:kept] + msgspec.to_builtins(messages[kept:])
        else:
            plain = msgspec.to_builtins(messages)
        self._prompts[key] = (messages, plain)
        while len(self._prompts) > REMEMBERED_PROMPTS:
            del self._prompts[next(iter(self._prompts))]
        out = msgspec.to_builtins(msgspec.structs.replace(result, messages=[]))
        out["messages"] = plain
        return out

    async def wait_stopped(self) -> None:
        await self.here.wait_stopped()

    async def close(self) -> None:
        await self.here.close()
