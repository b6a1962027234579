"""ctxd's JSON-RPC core (``server/jsonrpc.py``) in process: what it answers, in what
order, and what a cancel or an error turns into. The daemon-level behaviour (lifecycle,
framing, transports) is in tests/e2e; these pin the core's own rules."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import pytest

from ctxd.protocol.errors import REQUEST_CANCELLED, CtxdError, ErrorCode
from ctxd.server.connection import cancel_request
from ctxd.server.jsonrpc import Endpoint, frame


class Ack(msgspec.Struct, rename="camel"):
    session_id: str
    message_count: int


class FakePeer:
    """A connection reduced to what the core asks of it; frames are decoded back."""

    def __init__(self, refuse: dict[str, tuple[ErrorCode, str]] | None = None) -> None:
        self.id = 1
        self.close_after_reply = False
        self.frames: list[dict[str, Any]] = []
        self.notifications: list[tuple[str, Any]] = []
        self.events: list[str] = []
        self.closed = False
        self._refuse = refuse or {}

    def refuse(self, method: str) -> tuple[ErrorCode, str] | None:
        return self._refuse.get(method)

    def on_notification(self, method: str, params: Any) -> None:
        self.notifications.append((method, params))

    def initialize_finished(self) -> None:
        self.events.append("initialize_finished")

    def send_frame(self, data: bytes) -> None:
        header, _, body = data.partition(b"\r\n\r\n")
        assert header == b"Content-Length: %d" % len(body)
        message = msgspec.json.decode(body)
        self.frames.append(message)
        self.events.append(f"frame {message.get('id')}")

    def close(self) -> None:
        self.closed = True


def endpoint(handlers: dict[str, Any], **peer: Any) -> tuple[Endpoint, FakePeer]:
    p = FakePeer(**peer)
    return Endpoint(p, handlers, cancel_request), p


def request(msg_id: Any, method: str, params: Any = None, *, with_params: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if with_params:
        message["params"] = params
    return message


async def settle(ep: Endpoint) -> None:
    while ep.requests:
        await asyncio.wait(ep.in_flight())
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_struct_result_is_encoded_and_answered_under_its_id() -> None:
    seen: list[Any] = []

    async def push(params: Any) -> Ack:
        seen.append(params)
        return Ack(session_id=params["sessionId"], message_count=3)

    ep, peer = endpoint({"session/push": push})
    raw = {"sessionId": "s", "messages": []}
    ep.handle_raw(request(7, "session/push", raw))
    await settle(ep)
    assert seen == [raw] and seen[0] is raw  # params reach the handler as the client's dict
    assert peer.frames == [{"jsonrpc": "2.0", "id": 7, "result": {"sessionId": "s", "messageCount": 3}}]


async def test_a_request_without_params_is_answered() -> None:
    async def status(params: Any) -> dict[str, Any]:
        return {"params": params}

    ep, peer = endpoint({"daemon/status": status})
    ep.handle_raw(request("a", "daemon/status", with_params=False))
    await settle(ep)
    assert peer.frames == [{"jsonrpc": "2.0", "id": "a", "result": {"params": None}}]


async def test_requests_start_in_the_order_they_arrived() -> None:
    order: list[int] = []

    async def note(params: Any) -> int:
        order.append(params["n"])
        return params["n"]

    ep, peer = endpoint({"x/note": note})
    for n in range(20):
        ep.handle_raw(request(n, "x/note", {"n": n}))
    await settle(ep)
    assert order == list(range(20))
    assert [f["id"] for f in peer.frames] == list(range(20))


async def test_a_duplicate_id_in_flight_is_refused_and_the_first_still_answers() -> None:
    release = asyncio.Event()

    async def wait(params: Any) -> str:
        await release.wait()
        return "first"

    ep, peer = endpoint({"x/wait": wait})
    ep.handle_raw(request(1, "x/wait"))
    ep.handle_raw(request(1, "x/wait"))
    await asyncio.sleep(0)
    assert peer.frames == [{"jsonrpc": "2.0", "id": 1, "error": {
        "code": -32600, "message": "Invalid Request: id 1 is already in use by a request in flight"}}]
    release.set()
    await settle(ep)
    assert peer.frames[1] == {"jsonrpc": "2.0", "id": 1, "result": "first"}
    ep.handle_raw(request(1, "x/wait"))  # answered: the id is free again
    await settle(ep)
    assert peer.frames[2] == {"jsonrpc": "2.0", "id": 1, "result": "first"}


async def test_a_cancel_reaches_the_handler_with_ctxds_reason_and_is_answered_cancelled() -> None:
    reasons: list[Any] = []
    started = asyncio.Event()

    async def slow(params: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError as exc:
            reasons.append(exc.args[0] if exc.args else None)
            raise

    ep, peer = endpoint({"x/slow": slow})
    ep.handle_raw(request("c", "x/slow"))
    await started.wait()
    ep.cancel("c")
    ep.cancel("unknown")  # nothing in flight by that id: nothing happens
    await settle(ep)
    assert reasons == [REQUEST_CANCELLED]
    assert peer.frames == [{"jsonrpc": "2.0", "id": "c", "error": {
        "code": int(ErrorCode.RequestCancelled), "message": "request 'c' was cancelled"}}]


async def test_a_handler_that_completes_despite_a_cancel_is_answered_with_its_result() -> None:
    """A push whose transaction started finishes and answers (``Database.write``)."""
    started = asyncio.Event()

    async def write(params: Any) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError as exc:
            assert exc.args == (REQUEST_CANCELLED,)
            return "committed"
        return "never"

    ep, peer = endpoint({"x/write": write})
    ep.handle_raw(request(5, "x/write"))
    await started.wait()
    ep.cancel(5)
    await settle(ep)
    assert peer.frames == [{"jsonrpc": "2.0", "id": 5, "result": "committed"}]


async def test_a_request_cancelled_before_it_started_is_answered() -> None:
    ran: list[bool] = []

    async def never(params: Any) -> None:
        ran.append(True)

    ep, peer = endpoint({"x/never": never})
    ep.handle_raw(request(9, "x/never"))
    ep.cancel(9)
    await settle(ep)
    assert ran == []
    assert [f["error"]["code"] for f in peer.frames] == [int(ErrorCode.RequestCancelled)]


async def test_errors_map_to_codes_expected_ones_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def refused(params: Any) -> None:
        raise CtxdError(ErrorCode.SessionNotFound, "no session 'x'", {"field": "sessionId"})

    async def broken(params: Any) -> None:
        raise KeyError("oops")

    ep, peer = endpoint({"x/refused": refused, "x/broken": broken})
    caplog.set_level(logging.INFO, logger="ctxd.server.jsonrpc")
    ep.handle_raw(request(1, "x/refused"))
    ep.handle_raw(request(2, "x/broken"))
    await settle(ep)
    assert peer.frames[0] == {"jsonrpc": "2.0", "id": 1, "error": {
        "code": int(ErrorCode.SessionNotFound), "message": "no session 'x'", "data": {"field": "sessionId"}}}
    assert peer.frames[1]["error"] == {"code": int(ErrorCode.InternalError),
                                       "message": "Internal error: KeyError: 'oops'"}
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == ["internal error in request 2"]


async def test_a_result_msgspec_cannot_encode_is_answered_as_an_internal_error() -> None:
    async def odd(params: Any) -> Any:
        return object()

    ep, peer = endpoint({"x/odd": odd})
    ep.handle_raw(request(3, "x/odd"))
    await settle(ep)
    assert peer.frames[0]["id"] == 3
    assert peer.frames[0]["error"]["code"] == int(ErrorCode.InternalError)
    assert peer.frames[0]["error"]["message"].startswith("cannot encode result")


async def test_initialize_finished_is_told_after_its_answer_went_out() -> None:
    async def initialize(params: Any) -> dict[str, Any]:
        return {"capabilities": {}}

    ep, peer = endpoint({"initialize": initialize})
    ep.handle_raw(request(1, "initialize", {}))
    await settle(ep)
    assert peer.events == ["frame 1", "initialize_finished"]


async def test_close_after_reply_closes_once_the_answer_is_written() -> None:
    async def refuse_token(params: Any) -> None:
        ep.peer.close_after_reply = True  # type: ignore[misc]
        raise CtxdError(ErrorCode.Unauthorized, "wrong token")

    ep, peer = endpoint({"initialize": refuse_token})
    ep.handle_raw(request(1, "initialize", {}))
    await settle(ep)
    assert peer.frames[0]["error"]["code"] == int(ErrorCode.Unauthorized) and peer.closed


@pytest.mark.parametrize("message, answer", [
    ([{"jsonrpc": "2.0", "id": 1, "method": "x"}], (None, "Invalid Request: batch requests are not supported")),
    ("text", (None, "Invalid Request: expected a JSON object")),
    ({"jsonrpc": "1.0", "id": 4, "method": "x"}, (4, 'Invalid Request: "jsonrpc" must be "2.0"')),
    ({"jsonrpc": "2.0", "id": 4}, (4, 'Invalid Request: "method" is missing')),
    ({"jsonrpc": "2.0", "id": [1], "method": 3}, (None, 'Invalid Request: "method" must be a string')),
    ({"jsonrpc": "2.0", "id": True, "method": "x"}, (None, 'Invalid Request: "id" must be a string or integer')),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "x"}, (None, 'Invalid Request: "id" must be a string or integer')),
])
async def test_invalid_envelopes_are_answered(message: Any, answer: tuple[Any, str]) -> None:
    ep, peer = endpoint({})
    ep.handle_raw(message)
    assert [(f["id"], f["error"]["code"], f["error"]["message"]) for f in peer.frames] == [
        (answer[0], int(ErrorCode.InvalidRequest), answer[1])]


async def test_unknown_methods_refusals_notifications_and_stray_responses() -> None:
    ep, peer = endpoint({"x/known": lambda p: asyncio.sleep(0)},
                        refuse={"x/known": (ErrorCode.ServerNotInitialized, "server not initialized")})
    ep.handle_raw(request(1, "x/unknown"))
    ep.handle_raw(request(2, "x/known"))
    ep.handle_raw({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 1}})
    ep.handle_raw({"jsonrpc": "2.0", "id": 3, "result": None})
    ep.handle_raw({"jsonrpc": "2.0", "id": 4, "error": {"code": 1, "message": "m"}})
    assert [(f["id"], f["error"]["code"]) for f in peer.frames] == [
        (1, int(ErrorCode.MethodNotFound)), (2, int(ErrorCode.ServerNotInitialized))]
    assert peer.frames[0]["error"]["message"] == "Method Not Found: x/unknown"
    assert peer.notifications == [("$/cancelRequest", {"id": 1})]
    assert ep.requests == {}


async def test_notify_and_frame() -> None:
    ep, peer = endpoint({})
    ep.notify("session/updated", Ack(session_id="s", message_count=1))
    assert peer.frames == [{"jsonrpc": "2.0", "method": "session/updated",
                            "params": {"sessionId": "s", "messageCount": 1}}]
    assert frame({"a": 1}) == b'Content-Length: 7\r\n\r\n{"a":1}'


def test_frame_writes_its_header_in_front_of_the_body() -> None:
    """The header goes in the room left before the encoded body: its length is the body's,
    whatever the number of digits, and nothing is left between or before them."""
    for size in (0, 7, 99_999, 1_000_000):
        payload = {"jsonrpc": "2.0", "id": 1, "result": "x" * size}
        body = msgspec.json.encode(payload)
        assert bytes(frame(payload)) == b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
