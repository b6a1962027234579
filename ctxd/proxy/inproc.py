"""The ctxd daemon inside the proxy's process (``proxy.in_process``, docs/proxy.md).

When no daemon answers on the socket, the proxy does not start one apart: it runs the
daemon (``ctxd.daemon.Daemon``: its storage, its socket for ctxd-cli, editors and
``ctxd mcp``) on its own event loop, and calls the daemon's request dispatch directly.
A turn then costs no socket round trip: no JSON encoding of the request and of the
whole prompt, no wake-up of another process (docs/performance.md, docs/decisions.md).

What the socket path gives is kept:

* the same dispatch (``App.dispatch``: the params decoded against the method's Struct,
  the handler, its storage errors mapped), so the same validation and the same errors,
  turned into :class:`ctxd.client.RpcError` as the socket client raises them;
* requests of one session run in the order they were made, one after another (as on
  one daemon connection), those of other sessions alongside;
* a request whose caller is cancelled is cancelled as ``$/cancelRequest`` cancels it
  (``REQUEST_CANCELLED``): withdrawn if its write has not started, else carried through
  to the end (memory and storage alike) while the caller goes on;
* one daemon per socket: the daemon takes the socket's lock before it opens storage;
  when another process holds it, the proxy connects to that daemon as it would anyway;
* shutdown: the proxy drains its reply pushes first, then the daemon stops as it does
  on SIGTERM (its connections closed, storage closed after the writes in flight);
  ``daemon/stop`` from a socket client stops the proxy too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import os
from typing import Any

import msgspec

from ctxd.client import RpcError
from ctxd.config import Config
from ctxd.daemon import Daemon
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import METHODS
from ctxd.server.connection import Connection, cancel_request
from ctxd.server.handlers import HANDLERS

log = logging.getLogger("ctxd.proxy")

_ids = itertools.count(1)

REMEMBERED_PROMPTS = 64
"""Sessions whose last prompt is kept (``_prompt_builtins``), the most recent."""

PROXY_METHODS = frozenset({"session/get", "session/history", "session/create", "session/update", "session/push",
                           "session/list", "context/prompt", "context/stats"})
"""What the proxy asks of the daemon: methods that neither subscribe nor report progress
to a connection, so a caller with no connection of its own serves them as a socket does."""


class _Caller:
    """What ``App.dispatch`` needs of a connection, for the requests of one session: its
    order (``Connection.order``: each request waits for the one before it), an
    initialized state, no shutdown."""

    transport = "in-process"
    guarded = False
    initialized = True
    shutdown_requested = False
    client_name = "ctxd-proxy"

    order = Connection.order
    release = staticmethod(Connection.release)

    def __init__(self) -> None:
        self.id = f"in-process-{next(_ids)}"
        self._tail: asyncio.Future[None] | None = None
        self.subscriptions: set[str] = set()

    async def ready(self, method: str) -> None:
        return None

    def idle(self) -> bool:
        """No request of this session is waiting or running."""
        return self._tail is None or self._tail.done()


class InProcessLink:
    """The proxy's daemon link (``DaemonLink``'s interface) to a daemon in this process."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._callers: dict[str, _Caller] = {}
        self._prompts: dict[tuple[str, Any], tuple[list[Any], list[Any]]] = {}
        """The last prompt per session and format: its message objects and their plain data."""

    @classmethod
    async def open(cls, config: Config) -> InProcessLink:
        """Start the daemon (its socket and storage). Raises ``TransportError`` when the
        socket is taken (another daemon runs: connect to it instead), ``StoreOpenError``
        or ``StartupError`` as the daemon would exit with."""
        daemon = Daemon(config, unix=True)
        await daemon.start()
        log.warning("ctxd daemon %d in this process, serving %s", os.getpid(), config.socket_path)
        return cls(daemon)

    async def start(self) -> None:
        return None

    async def request(self, session_id: str, method: str, params: Any) -> Any:
        """``method`` as the daemon runs it for a socket client, its result as the client
        would decode it (plain dicts and lists), its error as :class:`RpcError`."""
        if method not in PROXY_METHODS:
            raise ValueError(f"{method!r} is not served in process")
        caller = self._callers.get(session_id)
        if caller is None:
            caller = self._callers[session_id] = _Caller()
        # Its own task, as a socket request is the daemon's: the caller's cancellation
        # reaches it only as a client's cancel would (above).
        task = asyncio.get_running_loop().create_task(
            self.daemon.app.dispatch(caller, METHODS[method], HANDLERS[method], params))  # type: ignore[arg-type]
        task.add_done_callback(lambda done: self._finished(session_id, caller, done))
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                cancel_request(task)
            raise
        except CtxdError as exc:
            raise RpcError(int(exc.code), exc.message, exc.data) from None
        except Exception as exc:  # what a socket client gets: an internal error (logged by _finished)
            raise RpcError(int(ErrorCode.InternalError), f"Internal error: {type(exc).__name__}: {exc}") from None
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
            same = list(map(operator.is_, last[0], messages))
            kept = same.index(False) if False in same else len(same)
            plain = last[1][:kept] + msgspec.to_builtins(messages[kept:])
        else:
            plain = msgspec.to_builtins(messages)
        self._prompts[key] = (messages, plain)
        while len(self._prompts) > REMEMBERED_PROMPTS:
            del self._prompts[next(iter(self._prompts))]
        out = msgspec.to_builtins(msgspec.structs.replace(result, messages=[]))
        out["messages"] = plain
        return out

    def _finished(self, session_id: str, caller: _Caller, task: asyncio.Task[Any]) -> None:
        """A request is over: its error logged if it is a bug (as the daemon logs one), the
        session's entry dropped once nothing of it waits or runs."""
        if not task.cancelled():
            exc = task.exception()  # (retrieved even when the caller left)
            if exc is not None and not isinstance(exc, CtxdError):
                log.error("internal error in a daemon request", exc_info=exc)
        if caller.idle() and self._callers.get(session_id) is caller:
            del self._callers[session_id]

    async def wait_stopped(self) -> None:
        """Until the daemon is asked to stop (``daemon/stop`` from a socket client)."""
        await self.daemon.stopped()

    async def close(self) -> None:
        """The daemon's stop path: its connections closed, storage closed."""
        self.daemon.stop()
        await self.daemon.close()
