"""One client connection: its lifecycle state, its JSON-RPC endpoint, its writer.

Each connection (the stdio pair, or one accepted socket) gets its own
:class:`~ctxd.server.jsonrpc.Endpoint` (ctxd's JSON-RPC core: a task per request, kept
by id until answered, answers encoded with msgspec) and adds what a multi-client
daemon needs per connection:

- params stay plain dicts until the handler decodes them against its Struct, and a
  request without ``params`` is answered;
- the LSP lifecycle is enforced per connection: -32002 before ``initialize``,
  -32600 after ``shutdown``, and ``exit`` closes this connection only;
- expected errors (:class:`CtxdError`) become JSON-RPC errors without a traceback
  in the log; anything else is logged once and answered with -32603;
- a socket client is held short until its ``initialize`` succeeds (``guarded``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ctxd.protocol.errors import REQUEST_CANCELLED, CtxdError, ErrorCode
from ctxd.protocol.methods import notification_method
from ctxd.server.framing import FrameError, FrameReader
from ctxd.server.jsonrpc import Endpoint, valid_id
from ctxd.server.writer import MAX_PENDING_OUTPUT, Writer
from ctxd.service.turns import TURNS

if TYPE_CHECKING:
    from ctxd.server.app import App

__all__ = ["Connection", "Writer", "cancel_request", "DRAIN_SECONDS"]

log = logging.getLogger(__name__)

_ids = itertools.count(1)
# MAX_PENDING_OUTPUT before ``initialize`` succeeded on a socket: such a client gets only
# errors, and one that sends requests without reading their answers must not make the
# daemon hold more than this for it.
MAX_PENDING_OUTPUT_BEFORE_INITIALIZE = 1024 * 1024


DRAIN_SECONDS = 60.0
"""How long requests already received may still run after the client's input ends."""


def cancel_request(future: Any) -> None:
    """Cancel a request in flight as its client's doing: a write it already started
    still completes and answers (see ``Database.write``)."""
    if isinstance(future, asyncio.Future):
        future.cancel(msg=REQUEST_CANCELLED)
    else:
        future.cancel()


class Connection:
    """A client: lifecycle flags, subscriptions, and the loop that reads its frames."""

    def __init__(self, app: App, reader: asyncio.StreamReader, writer: Writer, *, transport: str,
                 requires_token: bool = False, guarded: bool = False,
                 on_initialized: Callable[[Connection], None] | None = None) -> None:
        self.app = app
        self.id = next(_ids)
        self.transport = transport
        self.requires_token = requires_token
        self.guarded = guarded
        """A socket client (anyone who may connect, not the process that spawned us): until
        its ``initialize`` succeeds it gets ``limits.max_frame_bytes_before_initialize``,
        ``limits.initialize_timeout_seconds`` and little output buffer."""
        self._on_initialized = on_initialized
        self._frames: FrameReader | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.writer = writer
        self.reader = reader
        self.initialized = False
        self.initialize_done: asyncio.Event | None = None
        """Set when an ``initialize`` arrived; fires when it has been answered. Requests
        sent right behind it (pipelined, without waiting for its result) wait for it."""
        self.shutdown_requested = False
        self._tail: asyncio.Future[None] | None = None
        """Done when the last request that later ones must wait for has finished."""
        self._exiting: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        # Set by a handler whose answer must be the last thing this connection sends
        # (a refused token): the connection closes once that answer is written.
        self.close_after_reply = False
        self._task: asyncio.Task[None] | None = None
        self.client_name: str | None = None
        self.subscriptions: set[str] = set()
        self.rpc = Endpoint(self, app.handlers_for(self), cancel_request)

    def __repr__(self) -> str:
        return f"<Connection {self.id} {self.transport} {self.client_name or ''}>"

    def refuse(self, method: str) -> tuple[ErrorCode, str] | None:
        """Why a request may not run now, if it may not."""
        if self._exiting is not None:
            return ErrorCode.InvalidRequest, f"Invalid Request: {method!r} after exit"
        if self.shutdown_requested:
            return ErrorCode.InvalidRequest, f"Invalid Request: {method!r} after shutdown; only exit is accepted"
        if method == "initialize":
            if self.initialized or self.initialize_done is not None:
                return ErrorCode.InvalidRequest, "Invalid Request: initialize was already received"
            self.initialize_done = asyncio.Event()
            return None
        if not self.initialized and self.initialize_done is None:
            return ErrorCode.ServerNotInitialized, f"server not initialized: send initialize before {method!r}"
        return None

    def order(self, blocks_followers: bool) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """Take this request's place in the connection's order (call it before any await):
        (what to wait for, what to complete with :meth:`release`). A client may send
        ``session/create`` and pushes without waiting for answers: they run in the order
        sent. A request that does not ``blocks_followers`` (a compression that may wait
        minutes for an LLM) still waits for those before it, but later ones do not wait
        for it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        before = self._tail
        if blocks_followers:
            self._tail = done
        else:
            done.set_result(None)
        return before, done

    @staticmethod
    def release(before: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
        """This request is over (answered, failed or cancelled, even while still waiting
        its turn): the next may run once everything before this one has."""
        if done.done():
            return
        if before is None or before.done():
            done.set_result(None)
        else:
            def follow(_: Any) -> None:
                if not done.done():
                    done.set_result(None)

            before.add_done_callback(follow)

    def initialize_finished(self) -> None:
        """The ``initialize`` request is over, however it ended: wake what waits for it; if
        it failed, the client may send another."""
        event = self.initialize_done
        if event is not None:
            event.set()
            if not self.initialized:
                self.initialize_done = None
        if self.initialized:
            self._trusted()

    def _trusted(self) -> None:
        """``initialize`` succeeded: the limits of a client that has not are lifted."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._frames is not None:
            self._frames.max_frame_bytes = self.app.config.limits.max_frame_bytes
            self._frames.limit_note = ""
        self.writer.max_pending = MAX_PENDING_OUTPUT
        self.writer.overflow_log_level = logging.WARNING
        self.writer.widen_send_buffer()
        callback, self._on_initialized = self._on_initialized, None
        if callback is not None:
            callback(self)

    async def _initialize_settled(self) -> None:
        """Wait for an ``initialize`` that is running (the frame limit depends on it)."""
        event = self.initialize_done
        if event is not None and not event.is_set():
            await event.wait()

    def _initialize_overdue(self) -> None:
        self._deadline = None
        if self.initialized or self.closed.is_set():
            return
        seconds = self.app.config.limits.initialize_timeout_seconds
        log.info("connection %s: no successful initialize within %g s; closing it", self.id, seconds)
        self.rpc.send_error(None, ErrorCode.ServerNotInitialized,
                                 f"server not initialized: initialize must succeed within {seconds:g} s "
                                 f"of connecting; closing the connection")
        self.close()

    async def ready(self, method: str) -> None:
        """Wait for an ``initialize`` still running (see ``initialize_done``)."""
        if self.initialized or self.initialize_done is None:
            return
        await self.initialize_done.wait()
        if not self.initialized:
            raise CtxdError(ErrorCode.ServerNotInitialized,
                            f"server not initialized: initialize failed, so {method!r} cannot run")

    def on_notification(self, method: str, params: Any) -> None:
        if method == "exit":
            # Requests sent before it still finish (as at end of input); then it closes.
            if self._exiting is None:
                self._exiting = asyncio.get_running_loop().create_task(self._exit())
        elif method == "$/cancelRequest":
            if isinstance(params, dict) and "id" in params:
                self.rpc.cancel(params["id"])
        elif method == "initialized" or method.startswith("$/"):
            return
        elif self.initialized and not self.shutdown_requested:
            log.debug("ignoring unknown notification %r", method)

    def notify(self, notification: Any) -> None:
        """Send ``notification`` (a notification's params Struct, which names its method) to this client."""
        self.rpc.notify(notification_method(notification), notification)

    def send_frame(self, frame: bytes | bytearray) -> None:
        """An already encoded frame (a notification encoded once for many connections)."""
        self.writer.write(frame)

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for future in list(self.rpc.requests.values()):
            cancel_request(future)
        self.writer.close()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    async def _exit(self) -> None:
        try:
            await self._finish_in_flight()
        finally:
            self.close()

    async def _finish_in_flight(self) -> None:
        """The client stopped sending (EOF): requests it already sent still run to the
        end and are answered (``printf frames | ctxd`` stores its pushes), within
        ``DRAIN_SECONDS``; then the connection closes and cancels what is left."""
        # Every request not yet answered, including those just done whose answer is still
        # in a done-callback waiting to run (an ``exit`` behind ``shutdown`` ends the input
        # in the same instant; closing before those callbacks ran lost both answers).
        pending = [f for f in self.rpc.requests.values() if isinstance(f, asyncio.Future)]
        if not pending:
            return
        log.debug("connection %s: input ended; finishing %d request(s)", self.id, len(pending))
        started = asyncio.get_running_loop().time()
        await asyncio.wait(pending, timeout=DRAIN_SECONDS)
        await asyncio.sleep(0)  # their done-callbacks write the answers
        left = max(1.0, DRAIN_SECONDS - (asyncio.get_running_loop().time() - started))
        try:
            await asyncio.wait_for(self.writer.drain(), left)  # a client that stopped reading
        except TimeoutError:
            log.info("connection %s: the client is not reading its answers; closing", self.id)

    async def serve(self) -> None:
        """Read and dispatch frames until the client leaves or sends ``exit``."""
        limits = self.app.config.limits
        frames = FrameReader(self.reader, max_frame_bytes=limits.max_frame_bytes,
                             stall_seconds=limits.frame_stall_seconds,
                             step_aside=TURNS.step_aside_and_rest)
        self._frames = frames
        self._task = asyncio.current_task()
        if self.guarded and not self.initialized:
            frames.max_frame_bytes = min(limits.max_frame_bytes, limits.max_frame_bytes_before_initialize)
            frames.limit_note = " before initialize"
            frames.settle_limit = self._initialize_settled
            self.writer.max_pending = MAX_PENDING_OUTPUT_BEFORE_INITIALIZE
            self.writer.overflow_log_level = logging.INFO
            self._deadline = asyncio.get_running_loop().call_later(limits.initialize_timeout_seconds,
                                                                   self._initialize_overdue)
        try:
            while not self.closed.is_set():
                event = await frames.next()
                if event is None:
                    await self._finish_in_flight()
                    break
                if isinstance(event, FrameError):
                    log.info("connection %s: %s", self.id, event.reason)
                    self.rpc.send_error(None, ErrorCode.ParseError, f"Parse error: {event.reason}")
                    continue
                try:
                    self.rpc.handle_raw(event.message)
                except Exception:  # a bug must cost one request, never the connection
                    log.exception("connection %s: could not route a message", self.id)
                    msg_id = event.message.get("id") if isinstance(event.message, dict) else None
                    self.rpc.send_error(msg_id if valid_id(msg_id) else None, ErrorCode.InternalError,
                                             "Internal error while routing this message; see the daemon log")
        except asyncio.CancelledError:
            if not self.closed.is_set():
                raise
        finally:
            self.close()
