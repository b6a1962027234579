"""One client connection: its JSON-RPC protocol object, its lifecycle state, its writer.

Each connection (the stdio pair, or one accepted socket) gets its own
:class:`CtxdProtocol`, a pygls ``JsonRPCProtocol`` that keeps pygls' request
bookkeeping (a task per request, kept by id until it is answered, the result
callback) and changes what a multi-client daemon needs changed:

- messages are decoded and encoded with msgspec (results are msgspec Structs), and
  params stay plain dicts until the handler decodes them against its Struct;
- a request without ``params`` is answered (pygls 2.1 would drop it);
- the LSP lifecycle is enforced per connection: -32002 before ``initialize``,
  -32600 after ``shutdown``, and ``exit`` closes this connection only;
- expected errors (:class:`CtxdError`) become JSON-RPC errors without a traceback
  in the log; anything else is logged once and answered with -32603.

Requests enter pygls through its public ``handle_message`` and are routed to the
handlers registered on the connection's server with its public ``feature``. Two pygls
internals remain, because pygls 2.1 has no public way to do what they do (see
docs/decisions.md, "Foundations"; ``pyproject.toml`` pins pygls to the tested minor
version, and :func:`check_pygls` fails at import with a clear message if they are gone):

- ``JsonRPCProtocol._send_handler_result(future, *, msg_id)`` is overridden: it is the
  callback pygls attaches to every request's task, and the only place a result or an
  error can be encoded with msgspec and mapped to ctxd's error codes (pygls' own
  serializes with ``json.dumps`` and logs every error with a traceback);
- ``JsonRPCProtocol._request_futures`` (id -> the request's task) is read: to refuse a
  duplicate id in flight, to cancel a request with ctxd's own message (a started write
  still completes), and to finish or cancel what is in flight when a connection ends.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import msgspec
import pygls
from pygls.exceptions import JsonRpcException
from pygls.protocol import JsonRPCProtocol, JsonRPCRequestMessage, default_converter
from pygls.server import JsonRPCServer

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import notification_method
from ctxd.server.framing import FrameError, FrameReader
from ctxd.service.turns import TURNS
from ctxd.store.db import REQUEST_CANCELLED

if TYPE_CHECKING:
    from ctxd.server.app import App

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
_ids = itertools.count(1)
# Past this much unsent output the client is not reading; drop it rather than grow forever.
MAX_PENDING_OUTPUT = 64 * 1024 * 1024
# How long a closed connection's unsent output may take to go out before it is dropped.
CLOSE_GRACE_SECONDS = 10.0
# MAX_PENDING_OUTPUT before ``initialize`` succeeded on a socket: such a client gets only
# errors, and one that sends requests without reading their answers must not make the
# daemon hold more than this for it.
MAX_PENDING_OUTPUT_BEFORE_INITIALIZE = 1024 * 1024


PYGLS_TESTED = "2.1"
"""The pygls minor version whose internals (below) ctxd was tested with."""


def check_pygls() -> None:
    """Fail clearly, at import, if the pygls internals ctxd relies on are gone or changed.

    ``_send_handler_result(future, *, msg_id)`` must exist to be overridden, and
    ``_request_futures`` must be the dict ``JsonRPCProtocol`` keeps its requests' tasks in.
    (``tests/unit/test_pygls_internals.py`` also checks that pygls still calls them as
    ctxd expects.)"""
    version = getattr(pygls, "__version__", None) or _dist_version("pygls")
    missing: list[str] = []
    hook = getattr(JsonRPCProtocol, "_send_handler_result", None)
    if hook is None:
        missing.append("JsonRPCProtocol._send_handler_result")
    else:
        params = inspect.signature(hook).parameters
        if list(params)[:2] != ["self", "future"] or params.get("msg_id") is None \
                or params["msg_id"].kind is not inspect.Parameter.KEYWORD_ONLY:
            missing.append("JsonRPCProtocol._send_handler_result(self, future, *, msg_id)")
    for method in ("__init__", "_execute_handler"):
        fn = getattr(JsonRPCProtocol, method, None)
        if fn is None or "_request_futures" not in fn.__code__.co_names:
            missing.append(f"JsonRPCProtocol._request_futures (kept by {method})")
    if missing:
        raise ImportError(
            f"ctxd relies on pygls internals that pygls {version} does not have: {', '.join(missing)}. "
            f"ctxd was tested with pygls {PYGLS_TESTED}.x: install it (pip install 'pygls>={PYGLS_TESTED},<2.2'), "
            f"or see docs/decisions.md (Foundations) for what these internals do and how to replace them.")


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(unknown version)"


check_pygls()

_CONVERTER = default_converter()
"""One converter for every connection: ctxd encodes and decodes with msgspec, so pygls'
converter only serves its own fallback paths (building one costs ~8 ms per connection)."""


class Writer:
    """Where a connection's frames go: a StreamWriter, or a plain binary file (stdio fallback)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed = False
        self.max_pending = MAX_PENDING_OUTPUT
        self.overflow_log_level = logging.WARNING

    def write(self, data: bytes) -> bool:
        if self.closed:
            return False
        stream = self._stream
        try:
            if isinstance(stream, asyncio.StreamWriter):
                if stream.is_closing():
                    self.closed = True
                    return False
                stream.write(data)
                if stream.transport.get_write_buffer_size() > self.max_pending:
                    log.log(self.overflow_log_level, "client is not reading its output; closing the connection")
                    self.close(abort=True)  # its output is dropped now, not when it reads
                    return False
            else:
                stream.write(data)
                stream.flush()
        except (ConnectionError, OSError, RuntimeError):
            self.closed = True
            return False
        return True

    async def drain(self) -> None:
        """Wait until what was written has gone out (or the other side is gone)."""
        if self.closed or not isinstance(self._stream, asyncio.StreamWriter):
            return
        try:
            await self._stream.drain()
        except (ConnectionError, OSError, RuntimeError):
            self.closed = True

    def close(self, *, abort: bool = False) -> None:
        """Close after what is still unsent has gone out, within ``CLOSE_GRACE_SECONDS``
        (a client that never reads cannot keep its connection open); ``abort``: at once,
        dropping it."""
        if self.closed:
            return
        self.closed = True
        stream = self._stream
        try:
            if not isinstance(stream, asyncio.StreamWriter):
                stream.close()
                return
            transport = stream.transport
            if abort:
                transport.abort()
                return
            stream.close()
            if transport.get_write_buffer_size():
                asyncio.get_running_loop().call_later(CLOSE_GRACE_SECONDS, transport.abort)
        except (ConnectionError, OSError, RuntimeError):
            pass


DRAIN_SECONDS = 60.0
"""How long requests already received may still run after the client's input ends."""


class CtxdProtocol(JsonRPCProtocol):
    """pygls' JSON-RPC machinery bound to one ctxd connection."""

    def __init__(self, server: JsonRPCServer, converter: Any) -> None:
        super().__init__(server, converter)
        self.connection: Connection | None = None

    # --- inbound ---------------------------------------------------------------------

    def handle_raw(self, message: Any) -> None:
        """Route one decoded JSON value; invalid envelopes are answered, not dropped."""
        conn = self.connection
        assert conn is not None
        if not isinstance(message, dict):
            reason = "batch requests are not supported" if isinstance(message, list) else "expected a JSON object"
            self.send_error(None, ErrorCode.InvalidRequest, f"Invalid Request: {reason}")
            return
        msg_id = message.get("id")
        if message.get("jsonrpc") != "2.0":
            self.send_error(msg_id if _valid_id(msg_id) else None, ErrorCode.InvalidRequest,
                            'Invalid Request: "jsonrpc" must be "2.0"')
            return
        method = message.get("method")
        if method is None:
            if "result" in message or "error" in message:
                return  # ctxd sends no requests to clients; stray responses are ignored
            self.send_error(msg_id if _valid_id(msg_id) else None, ErrorCode.InvalidRequest,
                            'Invalid Request: "method" is missing')
            return
        if not isinstance(method, str):
            self.send_error(msg_id if _valid_id(msg_id) else None, ErrorCode.InvalidRequest,
                            'Invalid Request: "method" must be a string')
            return
        params = message.get("params")
        if "id" not in message:
            conn.on_notification(method, params)
            return
        if not _valid_id(msg_id):
            self.send_error(None, ErrorCode.InvalidRequest, 'Invalid Request: "id" must be a string or integer')
            return
        if msg_id in self._request_futures:
            self.send_error(msg_id, ErrorCode.InvalidRequest,
                            f"Invalid Request: id {msg_id!r} is already in use by a request in flight")
            return
        refusal = conn.refuse(method)
        if refusal is not None:
            self.send_error(msg_id, *refusal)
            return
        if method not in self.fm.features:
            log.warning("request %r: unknown method %r", msg_id, method)
            self.send_error(msg_id, ErrorCode.MethodNotFound, f"Method Not Found: {method}")
            return
        # pygls runs the handler registered for it as a task, kept in _request_futures
        # until _send_handler_result answers it.
        key = (conn.id, msg_id)
        # Heavy work of other requests steps aside while it runs (service/turns.py); its
        # task, made by handle_message, is made in the context that names it.
        context = TURNS.begin(key)
        context.run(self.handle_message, JsonRPCRequestMessage(id=msg_id, method=method, jsonrpc="2.0",
                                                               params=params))
        if msg_id not in self._request_futures:
            TURNS.end(key)
        if method == "initialize":
            future = self._request_futures.get(msg_id)
            if future is None:
                conn.initialize_finished()
            else:  # a done-callback runs even when the request is cancelled before it starts
                future.add_done_callback(lambda _: conn.initialize_finished())

    def cancel(self, msg_id: Any) -> None:
        future = self._request_futures.get(msg_id)
        if future is not None:
            cancel_request(future)

    # --- outbound --------------------------------------------------------------------

    def _send_handler_result(self, future: Future[Any], *, msg_id: Any) -> None:
        """(A pygls internal, overridden: the done-callback of every request's task.)"""
        self._request_futures.pop(msg_id, None)
        if self.connection is not None:
            TURNS.end((self.connection.id, msg_id))
        if future.cancelled():
            self.send_error(msg_id, ErrorCode.RequestCancelled, f"request {msg_id!r} was cancelled")
            return
        exc = future.exception()
        if exc is None:
            self._send_frame({"jsonrpc": "2.0", "id": msg_id, "result": future.result()})
        elif isinstance(exc, CtxdError):
            log.info("request %r failed: %s", msg_id, exc.message)
            self._send_frame({"jsonrpc": "2.0", "id": msg_id, "error": exc.to_dict()})
        elif isinstance(exc, JsonRpcException):
            self.send_error(msg_id, exc.code, exc.message, exc.data)
        else:
            log.error("internal error in request %r", msg_id, exc_info=exc)
            self.send_error(msg_id, ErrorCode.InternalError,
                            f"Internal error: {type(exc).__name__}: {exc}")
        if self.connection is not None and self.connection.close_after_reply:
            self.connection.close()

    def send_error(self, msg_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": int(code), "message": message}
        if data is not None:
            error["data"] = data
        self._send_frame({"jsonrpc": "2.0", "id": msg_id, "error": error})

    def notify(self, method: str, params: Any | None = None) -> None:
        self._send_frame({"jsonrpc": "2.0", "method": method, "params": params})

    def _send_frame(self, payload: dict[str, Any]) -> None:
        conn = self.connection
        if conn is None:
            return
        try:
            body = _encode(payload)
        except (TypeError, msgspec.EncodeError) as exc:  # a bug: never leave the client hanging
            log.error("cannot encode a response: %s", exc)
            body = _encode({"jsonrpc": "2.0", "id": payload.get("id"),
                            "error": {"code": int(ErrorCode.InternalError), "message": f"cannot encode result: {exc}"}})
        conn.writer.write(b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


class _ConnectionServer(JsonRPCServer):
    """pygls wants a server object behind each protocol; this one only logs quietly."""

    def report_server_error(self, error: Exception, source: Any) -> None:
        log.debug("%s: %s", getattr(source, "__name__", source), error)


def cancel_request(future: Any) -> None:
    """Cancel a request in flight as its client's doing: a write it already started
    still completes and answers (see ``Database.write``)."""
    if isinstance(future, asyncio.Future):
        future.cancel(msg=REQUEST_CANCELLED)
    else:
        future.cancel()


def _valid_id(value: Any) -> TypeGuard[str | int]:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


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
        server = _ConnectionServer(CtxdProtocol, lambda: _CONVERTER)
        for method, handler in app.handlers_for(self).items():
            server.feature(method)(handler)
        self.protocol: CtxdProtocol = server.protocol  # type: ignore[assignment]
        self.protocol.connection = self
        # Whatever pygls might still answer on its own (it has no path left that does)
        # goes out framed on this connection, not nowhere.
        self.protocol.set_writer(cast(Any, writer))  # (pygls calls write() and close(); it ignores write's bool)

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
        self.protocol.send_error(None, ErrorCode.ServerNotInitialized,
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
                self.protocol.cancel(params["id"])
        elif method == "initialized" or method.startswith("$/"):
            return
        elif self.initialized and not self.shutdown_requested:
            log.debug("ignoring unknown notification %r", method)

    def notify(self, notification: Any) -> None:
        """Send ``notification`` (a notification's params Struct, which names its method) to this client."""
        self.protocol.notify(notification_method(notification), notification)

    def send_frame(self, frame: bytes) -> None:
        """An already encoded frame (a notification encoded once for many connections)."""
        self.writer.write(frame)

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for future in list(self.protocol._request_futures.values()):
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
        futures: list[Any] = list(self.protocol._request_futures.values())  # (typed concurrent.futures')
        pending = [f for f in futures if isinstance(f, asyncio.Future)]
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
                    self.protocol.send_error(None, ErrorCode.ParseError, f"Parse error: {event.reason}")
                    continue
                try:
                    self.protocol.handle_raw(event.message)
                except Exception:  # a bug must cost one request, never the connection
                    log.exception("connection %s: could not route a message", self.id)
                    msg_id = event.message.get("id") if isinstance(event.message, dict) else None
                    self.protocol.send_error(msg_id if _valid_id(msg_id) else None, ErrorCode.InternalError,
                                             "Internal error while routing this message; see the daemon log")
        except asyncio.CancelledError:
            if not self.closed.is_set():
                raise
        finally:
            self.close()
