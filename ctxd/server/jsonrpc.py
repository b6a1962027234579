"""ctxd's JSON-RPC 2.0 core for one connection: what arrives is checked and routed, each
request runs as a task kept by its id until it is answered, answers and errors are
encoded with msgspec.

This is the small piece of JSON-RPC a multi-client daemon needs and that pygls 2.1's
public API does not give: results encoded with msgspec (pygls serializes with
``json.dumps`` after cattrs' unstructuring, which cannot take a Struct at all), a
request's task reachable by its id (to refuse a duplicate id in flight, to cancel with
ctxd's reason so a started write still answers, to finish or cancel what is in flight
when a connection ends), expected errors answered without a traceback in the log, and
no ``lsprotocol`` to import (a quarter of a second per daemon start). The measurements
behind that choice are in docs/decisions.md ("Foundations": "ctxd's own JSON-RPC
core"). Framing is ``framing.py``'s; the lifecycle rules (``initialize``, ``shutdown``,
``exit``) are the connection's (:class:`Peer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeGuard, cast

import msgspec

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.service.turns import TURNS

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]
"""A method's handler: the raw params (a dict, a list or None) in, the result out."""

_encoder = msgspec.json.Encoder()
_encode_into = _encoder.encode_into


class Peer(Protocol):
    """What the core asks of its connection: who it is, the lifecycle rules, the wire."""

    id: int
    close_after_reply: bool

    def refuse(self, method: str) -> tuple[ErrorCode, str] | None:
        """Why a request may not run now, if it may not."""

    def on_notification(self, method: str, params: Any) -> None: ...

    def initialize_finished(self) -> None:
        """The ``initialize`` request is over, however it ended (called after its answer)."""

    def send_frame(self, frame: bytes | bytearray) -> None: ...

    def close(self) -> None: ...


def valid_id(value: Any) -> TypeGuard[str | int]:
    """JSON-RPC ids ctxd accepts: a string or an integer (never a boolean)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


_HEAD_ROOM = 40
"""Bytes kept before the body for its header (``Content-Length: `` and up to 20 digits)."""


def frame(payload: Any) -> bytearray:
    """One LSP base-protocol frame of ``payload``, encoded by msgspec after room left for
    its header, which is written in front: a large answer (a 1,000-message prompt is ~1 MB)
    is not copied again to join the two."""
    buf = bytearray(_HEAD_ROOM)
    _encode_into(payload, buf, _HEAD_ROOM)
    head = b"Content-Length: %d\r\n\r\n" % (len(buf) - _HEAD_ROOM)
    start = _HEAD_ROOM - len(head)
    buf[start:_HEAD_ROOM] = head
    del buf[:start]  # (a bytearray drops its front without moving the rest)
    return buf


class Endpoint:
    """One connection's requests in flight and its way of answering them."""

    def __init__(self, peer: Peer, handlers: Mapping[str, Handler],
                 cancel: Callable[[asyncio.Future[Any]], None]) -> None:
        self.peer = peer
        self.handlers = handlers
        self._cancel = cancel
        """How a request's task is cancelled at its client's request (with a reason)."""
        self.requests: dict[Any, asyncio.Task[Any]] = {}
        """id -> the task of a request not yet answered."""

    # --- inbound ---------------------------------------------------------------------

    def handle_raw(self, message: Any) -> None:
        """Route one decoded JSON value; invalid envelopes are answered, not dropped."""
        if not isinstance(message, dict):
            reason = "batch requests are not supported" if isinstance(message, list) else "expected a JSON object"
            self.send_error(None, ErrorCode.InvalidRequest, f"Invalid Request: {reason}")
            return
        msg_id = message.get("id")
        if message.get("jsonrpc") != "2.0":
            self.send_error(msg_id if valid_id(msg_id) else None, ErrorCode.InvalidRequest,
                            'Invalid Request: "jsonrpc" must be "2.0"')
            return
        method = message.get("method")
        if method is None:
            if "result" in message or "error" in message:
                return  # ctxd sends no requests to clients; stray responses are ignored
            self.send_error(msg_id if valid_id(msg_id) else None, ErrorCode.InvalidRequest,
                            'Invalid Request: "method" is missing')
            return
        if not isinstance(method, str):
            self.send_error(msg_id if valid_id(msg_id) else None, ErrorCode.InvalidRequest,
                            'Invalid Request: "method" must be a string')
            return
        params = message.get("params")
        if "id" not in message:
            self.peer.on_notification(method, params)
            return
        if not valid_id(msg_id):
            self.send_error(None, ErrorCode.InvalidRequest, 'Invalid Request: "id" must be a string or integer')
            return
        if msg_id in self.requests:
            self.send_error(msg_id, ErrorCode.InvalidRequest,
                            f"Invalid Request: id {msg_id!r} is already in use by a request in flight")
            return
        refusal = self.peer.refuse(method)
        if refusal is not None:
            self.send_error(msg_id, *refusal)
            return
        handler = self.handlers.get(method)
        if handler is None:
            log.warning("request %r: unknown method %r", msg_id, method)
            self.send_error(msg_id, ErrorCode.MethodNotFound, f"Method Not Found: {method}")
            return
        self._start(msg_id, method, handler, params)

    def _start(self, msg_id: Any, method: str, handler: Handler, params: Any) -> None:
        """Run the handler as a task, in the order requests arrived (asyncio starts tasks
        in the order they were made); it is answered when the task ends."""
        key = (self.peer.id, msg_id)
        # Heavy work of other requests steps aside while it runs (service/turns.py): the
        # task is made in the context that names it.
        context = TURNS.begin(key)
        coro = cast(Coroutine[Any, Any, Any], handler(params))  # (every handler is a coroutine function)
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro, context=context)
        self.requests[msg_id] = task
        task.add_done_callback(lambda done: self._answer(msg_id, done))
        if method == "initialize":  # (after the answer: done-callbacks run in order)
            task.add_done_callback(lambda _: self.peer.initialize_finished())

    def cancel(self, msg_id: Any) -> None:
        """``$/cancelRequest``: cancel that request if it is still in flight."""
        task = self.requests.get(msg_id)
        if task is not None:
            self._cancel(task)

    def in_flight(self) -> list[asyncio.Task[Any]]:
        """The requests not yet answered."""
        return list(self.requests.values())

    # --- outbound --------------------------------------------------------------------

    def _answer(self, msg_id: Any, task: asyncio.Task[Any]) -> None:
        """A request's task ended: answer it, whatever became of it."""
        if self.requests.get(msg_id) is task:
            del self.requests[msg_id]
        TURNS.end((self.peer.id, msg_id))
        if task.cancelled():
            self.send_error(msg_id, ErrorCode.RequestCancelled, f"request {msg_id!r} was cancelled")
        else:
            exc = task.exception()
            if exc is None:
                self.send({"jsonrpc": "2.0", "id": msg_id, "result": task.result()})
            elif isinstance(exc, CtxdError):
                # A session looked up that does not exist (the proxy finding a conversation's
                # session, a client's "does it exist?") is an answer, not a failure: -vv only.
                log.log(logging.DEBUG if exc.code == ErrorCode.SessionNotFound else logging.INFO,
                        "request %r refused: %s", msg_id, exc.message)
                self.send({"jsonrpc": "2.0", "id": msg_id, "error": exc.to_dict()})
            else:
                log.error("internal error in request %r", msg_id, exc_info=exc)
                self.send_error(msg_id, ErrorCode.InternalError, f"Internal error: {type(exc).__name__}: {exc}")
        if self.peer.close_after_reply:
            self.peer.close()

    def send_error(self, msg_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": int(code), "message": message}
        if data is not None:
            error["data"] = data
        self.send({"jsonrpc": "2.0", "id": msg_id, "error": error})

    def notify(self, method: str, params: Any | None = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def send(self, payload: dict[str, Any]) -> None:
        """Encode and write one message; a value msgspec cannot encode is a bug, answered
        as one rather than leaving the client waiting."""
        try:
            data = frame(payload)
        except (TypeError, msgspec.EncodeError) as exc:
            log.error("cannot encode a response: %s", exc)
            data = frame({"jsonrpc": "2.0", "id": payload.get("id"),
                          "error": {"code": int(ErrorCode.InternalError), "message": f"cannot encode result: {exc}"}})
        self.peer.send_frame(data)
