"""Bad input, one case at a time: each gets its JSON-RPC error, the connection keeps
serving (a valid request right after succeeds), and nothing of it is stored.

One socket daemon serves the whole module, with low limits so that the limit cases
are cheap: frames over 100 kB, messages over 2000 bytes and batches over 50 messages
are refused, and a frame body that stalls for 0.5 s is treated as complete.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.helpers import Daemon, RawClient, db_rows, frame, request_frame, short_dir, user

pytestmark = pytest.mark.usefixtures("module_backend")

MAX_FRAME = 100_000
MAX_MESSAGE = 2000
MAX_BATCH = 50


@pytest.fixture(scope="module")
def limited_daemon(module_backend):
    base = short_dir()
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock", args=[
        "--set", "limits.frame_stall_seconds=0.5",
        "--set", f"limits.max_frame_bytes={MAX_FRAME}",
        "--set", f"limits.max_message_bytes={MAX_MESSAGE}",
        "--set", f"limits.max_batch_messages={MAX_BATCH}",
    ])
    daemon.start()
    yield daemon
    daemon.stop()
    assert "Traceback" not in daemon.stderr_text()
    shutil.rmtree(base, ignore_errors=True)


class Case:
    """A connection with one session holding one message, to prove nothing changes."""

    def __init__(self, daemon: Daemon, client: RawClient, sid: str) -> None:
        self.daemon = daemon
        self.client = client
        self.sid = sid

    async def unchanged(self) -> None:
        """The connection still serves, and the session still holds exactly its one message."""
        info = await self.client.result("session/get", {"sessionId": self.sid})
        assert (info["messageCount"], info["lastSeq"]) == (1, 1)
        assert [body["content"] for _, body, _ in db_rows(self.daemon.data_dir, self.sid)] == ["baseline"]
        listed = await self.client.result("session/list", {})
        assert self.sid in [s["sessionId"] for s in listed["sessions"]]
        pushed = await self.client.result("session/push", {"sessionId": self.sid, "messages": [user("next")]})
        assert pushed["messages"][0]["seq"] == 2


@pytest.fixture
async def case(limited_daemon, request) -> Case:
    client = await limited_daemon.raw()
    await client.initialize()
    sid = request.node.name
    await client.result("session/create", {"sessionId": sid})
    await client.result("session/push", {"sessionId": sid, "messages": [user("baseline")]})
    yield Case(limited_daemon, client, sid)
    await client.close()



def push_body(sid: str, msg_id: Any = 1, messages: list[dict[str, Any]] | None = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "session/push",
                       "params": {"sessionId": sid, "messages": messages or [user("must not be stored")]}}).encode()


def with_length(body: bytes, length: int) -> bytes:
    return b"Content-Length: %d\r\n\r\n%b" % (length, body)


def after(sid: str) -> bytes:
    """A valid request sent behind the bad bytes; it must be answered."""
    return request_frame("after", "session/get", {"sessionId": sid})


# --- framing and envelopes: (bytes to send, expected errors with id null, more answered ids) ---

def _malformed(sid: str) -> bytes:
    body = push_body(sid)[:-15]
    return with_length(body, len(body)) + after(sid)


def _too_long_swallows_next(sid: str) -> bytes:
    body = push_body(sid)
    return with_length(body, len(body) + 40) + after(sid)


def _too_long_then_stall(sid: str) -> bytes:
    # Nothing follows: after limits.frame_stall_seconds the daemon answers anyway.
    body = push_body(sid)
    return with_length(body, len(body) + 40)


def _too_short(sid: str) -> bytes:
    body = push_body(sid)
    return with_length(body, len(body) - 10) + after(sid)


def _garbage_between_frames(sid: str) -> bytes:
    return request_frame("before", "session/list", {}) + b"garbage \x00\xff\r\nmore junk\r\n\r\n" + after(sid)


def _oversized(sid: str) -> bytes:
    messages = [user("y" * 1500) for _ in range(80)]  # a real push, over the frame limit
    body = push_body(sid, messages=messages)
    assert len(body) > MAX_FRAME
    return with_length(body, len(body)) + after(sid)


def _header_without_length(sid: str) -> bytes:
    body = push_body(sid)
    return b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n" + body + after(sid)


def _not_utf8(sid: str) -> bytes:
    body = push_body(sid).replace(b"must not be stored", b"caf\xe9 must not be stored")
    return with_length(body, len(body)) + after(sid)


def _nested_too_deep(sid: str) -> bytes:
    body = b"[" * 100_000
    return with_length(body, len(body)) + after(sid)


def _batch(sid: str) -> bytes:
    return frame([json.loads(push_body(sid))]) + after(sid)


def _length_of_5000_digits(sid: str) -> bytes:
    # More digits than int() accepts: no frame can be that long, so the reader skips to
    # the next header at once instead of waiting for a body that never ends.
    return b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n" + push_body(sid) + after(sid)


def _scalar(sid: str) -> bytes:
    return frame(42) + after(sid)


FRAMING_CASES: dict[str, tuple[Callable[[str], bytes], list[int], list[str]]] = {
    "malformed_json": (_malformed, [-32700], ["after"]),
    "content_length_too_long": (_too_long_swallows_next, [-32700], ["after"]),
    "content_length_too_long_then_stall": (_too_long_then_stall, [-32700], []),
    "content_length_too_short": (_too_short, [-32700], ["after"]),
    "garbage_between_frames": (_garbage_between_frames, [-32700], ["before", "after"]),
    "content_length_over_max_frame_bytes": (_oversized, [-32700], ["after"]),
    "content_length_of_5000_digits": (_length_of_5000_digits, [-32700], ["after"]),
    "header_without_content_length": (_header_without_length, [-32700], ["after"]),
    "body_not_utf8": (_not_utf8, [-32700], ["after"]),
    "body_nested_too_deep": (_nested_too_deep, [-32700], ["after"]),
    "json_array_batch": (_batch, [-32600], ["after"]),
    "json_scalar": (_scalar, [-32600], ["after"]),
}


@pytest.mark.parametrize("name", FRAMING_CASES)
async def test_framing_errors(case: Case, name: str):
    build, null_errors, answered = FRAMING_CASES[name]
    await case.client.send_raw(build(case.sid))
    got_errors: list[dict[str, Any]] = []
    got_ids: list[str] = []
    while len(got_errors) < len(null_errors) or len(got_ids) < len(answered):
        message = await case.client.next_message()
        if message.get("id") is None:
            got_errors.append(message["error"])
        else:
            assert "result" in message, message
            got_ids.append(message["id"])
    assert [e["code"] for e in got_errors] == null_errors, got_errors
    assert sorted(got_ids) == sorted(answered)
    if name == "content_length_over_max_frame_bytes":
        assert str(MAX_FRAME) in got_errors[0]["message"]
    # Exactly one error per bad frame: nothing else is pending on the connection.
    await case.unchanged()
    assert case.client.inbox == []


# --- envelopes with an id -------------------------------------------------------------------

ENVELOPES = {
    "no_jsonrpc_version": ({"id": 5, "method": "session/list"}, 5),
    "wrong_jsonrpc_version": ({"jsonrpc": "1.0", "id": 5, "method": "session/list"}, 5),
    "method_not_a_string": ({"jsonrpc": "2.0", "id": 5, "method": 12}, 5),
    "no_method": ({"jsonrpc": "2.0", "id": 5}, 5),
    "id_is_an_object": ({"jsonrpc": "2.0", "id": {"n": 1}, "method": "session/list"}, None),
    "id_is_a_bool": ({"jsonrpc": "2.0", "id": True, "method": "session/list"}, None),
}


@pytest.mark.parametrize("name", ENVELOPES)
async def test_invalid_envelopes(case: Case, name: str):
    payload, answer_id = ENVELOPES[name]
    await case.client.send(payload)
    message = await case.client.next_message()
    assert message["id"] == answer_id
    assert message["error"]["code"] == -32600
    await case.unchanged()


async def test_same_id_twice_in_flight(case: Case):
    # Both frames arrive in one read: the second is refused while the first runs.
    await case.client.send_raw(request_frame(7, "session/list", {}) + request_frame(7, "session/list", {}))
    first, second = await case.client.next_message(), await case.client.next_message()
    assert {first["id"], second["id"]} == {7}
    assert sorted(("error" in first, "error" in second)) == [False, True]
    error = first.get("error") or second["error"]
    assert error["code"] == -32600 and "in flight" in error["message"]
    await case.unchanged()


async def test_notifications_and_stray_responses_are_ignored(case: Case):
    await case.client.send({"jsonrpc": "2.0", "method": "no/such/notification", "params": {"x": 1}})
    await case.client.send({"jsonrpc": "2.0", "method": "session/push",  # a push sent as a notification
                            "params": {"sessionId": case.sid, "messages": [user("not a request")]}})
    await case.client.send({"jsonrpc": "2.0", "id": 99, "result": {"ok": True}})
    await case.client.send({"jsonrpc": "2.0", "id": 98, "error": {"code": 1, "message": "x"}})
    await case.unchanged()
    assert case.client.inbox == []


# --- requests the daemon understands and refuses ----------------------------------------------


def _ten_with_fifth(bad: dict[str, Any]) -> list[dict[str, Any]]:
    messages = [user(f"ok {i}") if i % 2 == 0 else {"role": "assistant", "content": f"ok {i}"} for i in range(10)]
    messages[4] = bad
    return messages


# name -> (method, params builder, code, data.field, text the message must contain)
REFUSALS: dict[str, tuple[str, Callable[[str], Any], int, str | None, str]] = {
    "unknown_method": ("session/teleport", lambda s: {"sessionId": s}, -32601, None, "session/teleport"),
    "params_not_an_object": ("session/push", lambda s: [s], -32602, "params", "object"),
    "session_id_wrong_type": ("session/get", lambda s: {"sessionId": 42}, -32602, "sessionId", "str"),
    "content_wrong_type": ("session/push", lambda s: {"sessionId": s, "messages": [
        user("a"), user("b"), {"role": "user", "content": 5}]}, -32602, "messages[2].content",
        "messages[2].content"),
    "role_not_a_role": ("session/push", lambda s: {"sessionId": s, "messages": [{"role": "robot", "content": "x"}]},
                        -32602, "messages[0].role", "messages[0].role"),
    "missing_messages": ("session/push", lambda s: {"sessionId": s}, -32602, "messages", "messages"),
    "missing_session_id": ("session/push", lambda s: {"messages": [user("x")]}, -32602, "sessionId", "sessionId"),
    "missing_role": ("session/push", lambda s: {"sessionId": s, "messages": [{"content": "x"}]}, -32602,
                     "messages[0].role", "role"),
    "unknown_message_field": ("session/push", lambda s: {"sessionId": s, "messages": [user("x", colour="red")]},
                              -32602, "messages[0]", "colour"),
    "empty_batch": ("session/push", lambda s: {"sessionId": s, "messages": []}, -32602, "messages", "at least one"),
    "tool_without_tool_call_id": ("session/push", lambda s: {"sessionId": s, "messages": [
        user("a"), {"role": "tool", "content": "result"}]}, -32602, "messages[1].toolCallId", "toolCallId"),
    "tool_calls_on_user_message": ("session/push", lambda s: {"sessionId": s, "messages": [user("a", toolCalls=[
        {"id": "c", "function": {"name": "f"}}])]}, -32602, "messages[0].toolCalls", "assistant"),
    "bad_timestamp": ("session/push", lambda s: {"sessionId": s, "messages": [user("a", timestamp="yesterday")]},
                      -32602, "messages[0].timestamp", "ISO 8601"),
    "message_too_large": ("session/push", lambda s: {"sessionId": s, "messages": [
        user("small"), user("z" * (MAX_MESSAGE + 10))]}, -33003, "messages[1]", "messages[1]"),
    "unknown_session_push": ("session/push", lambda s: {"sessionId": s + "-nope", "messages": [user("x")]},
                             -33001, "sessionId", "does not exist"),
    "unknown_session_get": ("session/get", lambda s: {"sessionId": s + "-nope"}, -33001, "sessionId", "nope"),
    "unknown_session_stats": ("context/stats", lambda s: {"sessionId": s + "-nope"}, -33001, "sessionId", "nope"),
    "unknown_session_prompt": ("context/prompt", lambda s: {"sessionId": s + "-nope"}, -33001, "sessionId", "nope"),
    "unknown_session_delete": ("session/delete", lambda s: {"sessionId": s + "-nope"}, -33001, "sessionId", "nope"),
    "unknown_session_subscribe": ("session/subscribe", lambda s: {"sessionId": s + "-nope"}, -33001, "sessionId",
                                  "nope"),
    "duplicate_session_id": ("session/create", lambda s: {"sessionId": s}, -33002, "sessionId", "exists"),
    "unknown_params_field": ("session/get", lambda s: {"sessionId": s, "bogus": 1}, -32602, "bogus", "bogus"),
    "context_window_absurd": ("session/create", lambda s: {"sessionId": s + "-new", "contextWindow": 10**23},
                              -32602, "contextWindow", "contextWindow"),
    "negative_usage": ("session/push", lambda s: {"sessionId": s, "messages": [
        {"role": "assistant", "content": "x", "usage": {"inputTokens": -5}}]}, -32602,
        "messages[0].usage.inputTokens", "not a token count"),
    "history_from_absurd": ("session/history", lambda s: {"sessionId": s, "from": 10**23}, -32602, "from", "from"),
    "pin_seq_zero": ("message/pin", lambda s: {"sessionId": s, "seq": 0}, -32602, "seq", ">= 1"),
    "context_window_too_small": ("session/create", lambda s: {"sessionId": s + "-new", "contextWindow": 10},
                                 -32602, "contextWindow", "256"),
    "empty_session_id": ("session/create", lambda s: {"sessionId": "   "}, -32602, "sessionId", "sessionId"),
    "batch_over_limit": ("session/push", lambda s: {"sessionId": s, "messages": [
        user(f"m{i}") for i in range(MAX_BATCH + 1)]}, -33004, "messages", str(MAX_BATCH)),
    "fifth_of_ten_wrong_type": ("session/push", lambda s: {"sessionId": s, "messages": _ten_with_fifth(
        {"role": "user", "content": {"text": "not a list"}})}, -32602, "messages[4].content", "messages[4]"),
    "fifth_of_ten_tool_without_id": ("session/push", lambda s: {"sessionId": s, "messages": _ten_with_fifth(
        {"role": "tool", "content": "r"})}, -32602, "messages[4].toolCallId", "messages[4]"),
    "fifth_of_ten_too_large": ("session/push", lambda s: {"sessionId": s, "messages": _ten_with_fifth(
        user("w" * (MAX_MESSAGE * 2)))}, -33003, "messages[4]", "messages[4]"),
    "fifth_of_ten_tool_use_from_user": ("session/push", lambda s: {"sessionId": s, "messages": _ten_with_fifth(
        {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]})}, -32602,
        "messages[4].content[0]", "messages[4]"),
    "fifth_of_ten_bad_idempotency_key": ("session/push", lambda s: {"sessionId": s, "messages": _ten_with_fifth(
        user("k", idempotencyKey=""))}, -32602, "messages[4].idempotencyKey", "idempotencyKey"),
}


@pytest.mark.parametrize("name", REFUSALS)
async def test_refused_requests(case: Case, name: str):
    method, build, code, field, text = REFUSALS[name]
    error = await case.client.error(method, build(case.sid))
    assert error["code"] == code, error
    if field is not None:
        assert error["data"]["field"] == field, error
    assert text in error["message"], error
    if code == -33003:
        assert error["data"]["limit"] == MAX_MESSAGE and error["data"]["size"] > MAX_MESSAGE
    if code == -33004:
        assert error["data"]["count"] == MAX_BATCH + 1 and error["data"]["limit"] == MAX_BATCH
    await case.unchanged()
    # Nothing else was created either.
    listed = await case.client.result("session/list", {})
    assert not [s for s in listed["sessions"] if s["sessionId"].startswith(case.sid + "-")]


async def test_batch_at_the_limit_is_accepted(case: Case):
    pushed = await case.client.result("session/push", {"sessionId": case.sid, "messages": [
        user(f"m{i}") for i in range(MAX_BATCH)]})
    assert pushed["messageCount"] == 1 + MAX_BATCH
    # A message just under the size limit is accepted (its JSON encoding is what counts).
    content = "q" * (MAX_MESSAGE - len(json.dumps(user(""), separators=(",", ":"))))
    pushed = await case.client.result("session/push", {"sessionId": case.sid, "messages": [user(content)]})
    assert pushed["messageCount"] == 2 + MAX_BATCH
