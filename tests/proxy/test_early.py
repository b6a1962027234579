"""A request whose prompt will be the client's own conversation goes upstream before its
turn (push and prompt), which runs while the upstream answers (``Sessions.early``): the
upstream gets the client's bytes, the session gets every message, and anything that makes
ctxd's prompt differ (a goal set by another client, a compression) is never sent ahead."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ctxd_client, history
from tests.proxy.upstream import MODEL

AHEAD = "sent before its turn"
DIFFERED = "is not the client's"


@pytest.fixture
def proxy_mode() -> str:
    """Sending ahead needs the daemon's notifications as they happen: in the proxy's process."""
    return "in-process"


def _headers(session: str, window: int) -> dict[str, str]:
    return {"authorization": "Bearer sk-test", "x-ctxd-session": session, "x-ctxd-context-window": str(window),
            "content-type": "application/json"}


def _bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body, indent=1).encode()


async def _stored(daemon: Any, session: str, count: int) -> None:
    """Until the session holds ``count`` messages: the reply's push, which the proxy does not
    wait for, is stored (a request goes ahead only once it is, as an agent's next request,
    made after running a tool, finds it)."""
    client = await ctxd_client(daemon)
    try:
        for _ in range(1000):
            if (await client.request("session/get", {"sessionId": session}))["messageCount"] >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{session}: {count} messages never stored")
    finally:
        await client.close()


async def test_a_growing_conversation_goes_ahead_and_every_message_is_stored(proxy, upstream, ctxd_daemon) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    sent: list[bytes] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for turn in range(8):
            messages.append({"role": "user", "content": f"Turn {turn}: what changed in module {turn}?"})
            sent.append(_bytes({"model": MODEL, "messages": messages}))
            answer = await http.post(proxy.url + "/v1/chat/completions", content=sent[-1],
                                     headers=_headers("ahead", 200000))
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-ctxd-session"] == "ahead"
            assert "billed=" in answer.headers["x-ctxd-bill"]
            messages.append(answer.json()["choices"][0]["message"])
            await _stored(ctxd_daemon, "ahead", 2 * turn + 2)
        # A streamed turn goes ahead too, and its reply is stored.
        messages.append({"role": "user", "content": "Stream the summary."})
        sent.append(_bytes({"model": MODEL, "messages": messages, "stream": True}))
        async with http.stream("POST", proxy.url + "/v1/chat/completions", content=sent[-1],
                               headers=_headers("ahead", 200000)) as streamed:
            assert streamed.status_code == 200
            assert streamed.headers["x-ctxd-session"] == "ahead"
            assert b"[DONE]" in b"".join([chunk async for chunk in streamed.aiter_bytes()])
    assert [r.body for r in upstream.chats("/v1/chat/completions")] == sent
    log = proxy.log()
    # All but the first two: a new session, then one whose reply floor its first reply set.
    assert log.count(AHEAD) >= 7, log
    assert DIFFERED not in log
    stored = await history(ctxd_daemon, "ahead")
    assert [m["role"] for m in stored] == ["user", "assistant"] * 9
    assert [m["content"] for m in stored if m["role"] == "user"] == \
        [m["content"] for m in messages if m["role"] == "user"]


async def test_a_goal_set_by_another_client_is_in_the_next_request(proxy, upstream, ctxd_daemon) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    async with httpx.AsyncClient(timeout=30) as http:
        async def turn(text: str) -> dict[str, Any]:
            messages.append({"role": "user", "content": text})
            answer = await http.post(proxy.url + "/v1/chat/completions", headers=_headers("goal", 200000),
                                     content=_bytes({"model": MODEL, "messages": messages}))
            assert answer.status_code == 200, answer.text
            messages.append(answer.json()["choices"][0]["message"])
            await _stored(ctxd_daemon, "goal", len(messages) - 1)
            return upstream.chats("/v1/chat/completions")[-1].json

        for i in range(4):
            await turn(f"Step {i}.")
        ahead = proxy.log().count(AHEAD)
        assert ahead >= 1
        client = await ctxd_client(ctxd_daemon)
        try:
            await client.request("goal/set", {"sessionId": "goal", "description": "Keep every test green."})
        finally:
            await client.close()
        got = await turn("Step 4.")
        assert "Keep every test green." in got["messages"][1]["content"]
    assert proxy.log().count(AHEAD) == ahead  # (not ahead: the goal made ctxd's prompt another)
    assert DIFFERED not in proxy.log()


async def test_compression_is_never_sent_ahead(proxy, upstream, ctxd_daemon) -> None:
    """At a small window the conversation crosses the trigger: requests go ahead while
    they cannot reach it, never one whose prompt ctxd compresses."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful engineer."}]
    async with httpx.AsyncClient(timeout=30) as http:
        for turn in range(40):
            filler = " ".join(f"module{turn}-{k} passed its checks" for k in range(12))
            messages.append({"role": "user", "content": f"Turn {turn}: {filler}."})
            body = {"model": MODEL, "messages": messages}
            answer = await http.post(proxy.url + "/v1/chat/completions", content=_bytes(body),
                                     headers=_headers("small", 4096))
            assert answer.status_code == 200, answer.text
            messages.append(answer.json()["choices"][0]["message"])
            await _stored(ctxd_daemon, "small", 2 * turn + 2)
    received = upstream.chats("/v1/chat/completions")
    compressed = [r for r, m in zip(received, range(len(received))) if len(r.json["messages"]) < 2 * m + 2]
    log = proxy.log()
    assert compressed, "the conversation never went past the trigger"
    assert log.count(AHEAD) >= 5, log
    assert DIFFERED not in log
    # What went ahead is the client's own bytes; what was compressed is ctxd's prompt.
    assert all(b"passed its checks" in r.body for r in received)


async def test_a_goal_the_reply_sets_is_in_the_next_request(proxy, upstream, ctxd_daemon) -> None:
    """A reply with a goal marker changes the prompt once its push is stored (a goal block):
    the client's next request is not sent ahead of that, whether it comes while the push
    is on its way or after it was stored."""
    for session, wait in (("marker-soon", False), ("marker-later", True)):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
        async with httpx.AsyncClient(timeout=30) as http:
            for i in range(4):
                upstream.padding = "\n[GOAL] Ship the parser." if i == 2 else ""
                messages.append({"role": "user", "content": f"Step {i}."})
                answer = await http.post(proxy.url + "/v1/chat/completions", headers=_headers(session, 200000),
                                         content=_bytes({"model": MODEL, "messages": messages}))
                assert answer.status_code == 200, answer.text
                messages.append(answer.json()["choices"][0]["message"])
                if i == 2 and wait:
                    assert len(await history(ctxd_daemon, session)) == 6  # (the reply's push is stored)
        last = upstream.chats("/v1/chat/completions")[-1].json
        assert "Ship the parser." in last["messages"][1]["content"]  # ctxd's goal block, after the system prompt
        client = await ctxd_client(ctxd_daemon)
        try:
            got = await client.request("goal/get", {"sessionId": session})
        finally:
            await client.close()
        assert got["goal"]["description"] == "Ship the parser."
    assert DIFFERED not in proxy.log()


async def _turns(http: httpx.AsyncClient, url: str, daemon: Any, session: str, messages: list[dict[str, Any]],
                 texts: list[str], stored: int) -> int:
    """Turns of ``texts``, each after the reply before it was stored; the messages stored then."""
    for text in texts:
        messages.append({"role": "user", "content": text})
        answer = await http.post(url + "/v1/chat/completions", headers=_headers(session, 200000),
                                 content=_bytes({"model": MODEL, "messages": messages}))
        assert answer.status_code == 200, answer.text
        messages.append(answer.json()["choices"][0]["message"])
        stored += 2
        await _stored(daemon, session, stored)
    return stored


async def test_another_clients_push_is_in_the_next_request(proxy, upstream, ctxd_daemon) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    async with httpx.AsyncClient(timeout=30) as http:
        stored = await _turns(http, proxy.url, ctxd_daemon, "foreign", messages, [f"Step {i}." for i in range(4)], 0)
        ahead = proxy.log().count(AHEAD)
        assert ahead >= 1
        client = await ctxd_client(ctxd_daemon)
        try:
            await client.request("session/push", {"sessionId": "foreign", "messages": [
                {"role": "user", "content": "A note from the editor: the parser is in src/parse.py."}]})
        finally:
            await client.close()
        await _turns(http, proxy.url, ctxd_daemon, "foreign", messages, ["Step 4."], stored + 1)
    sent = upstream.chats("/v1/chat/completions")[-1].json["messages"]
    assert any("A note from the editor" in str(m.get("content")) for m in sent)
    assert proxy.log().count(AHEAD) == ahead
    assert DIFFERED not in proxy.log()


async def test_a_dropped_system_prompt_is_not_sent_ahead(proxy, upstream, ctxd_daemon) -> None:
    """ctxd keeps the session's system prompt when a request has none: its prompt is then
    not the client's."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    async with httpx.AsyncClient(timeout=30) as http:
        stored = await _turns(http, proxy.url, ctxd_daemon, "no-system", messages, [f"Step {i}." for i in range(4)], 0)
        ahead = proxy.log().count(AHEAD)
        await _turns(http, proxy.url, ctxd_daemon, "no-system", messages[1:], ["Step 4."], stored)
    assert upstream.chats("/v1/chat/completions")[-1].json["messages"][0] == messages[0]
    assert proxy.log().count(AHEAD) == ahead
    assert DIFFERED not in proxy.log()


async def test_a_turn_that_fails_after_sending_answers_its_error(start_proxy, upstream, ctxd_daemon) -> None:
    """A message the daemon refuses (over ``limits.max_message_bytes``) in a request sent
    ahead: the client gets the error it gets otherwise, not the answer; nothing is stored."""
    proxy = start_proxy("--set", "limits.max_message_bytes=2000")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    async with httpx.AsyncClient(timeout=30) as http:
        await _turns(http, proxy.url, ctxd_daemon, "refused", messages, [f"Step {i}." for i in range(4)], 0)
        ahead = proxy.log().count(AHEAD)
        assert ahead >= 1
        messages.append({"role": "user", "content": "x" * 3000})
        for stream in (False, True):
            answer = await http.post(proxy.url + "/v1/chat/completions", headers=_headers("refused", 200000),
                                     content=_bytes({"model": MODEL, "messages": messages, "stream": stream}))
            assert answer.status_code >= 400, answer.text
            assert "2000" in answer.text  # (the limit it passed)
    # The first went ahead; the second waited for its turn (refused, it was not sent).
    assert "gets that error, not the upstream's answer" in proxy.log()
    assert sum(r.json["messages"][-1]["content"] == "x" * 3000 for r in upstream.chats("/v1/chat/completions")) == 1
    stored = await history(ctxd_daemon, "refused")
    assert len(stored) == 8 and all(m["content"] != "x" * 3000 for m in stored)


class _Recorder:
    """An OpenAI-shaped upstream on a socket in a thread of its own (so that it reads a
    request whenever the proxy's loop has written it, whatever that loop does next): it
    answers every chat request and tells, by an event per request, that it was read."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.read: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.count = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(buffer) < length:
                buffer += conn.recv(65536)
            buffer = buffer[length:]
            self.read[self.count].set()
            self.count += 1
            body = json.dumps({"id": f"c{self.count}", "object": "chat.completion", "model": MODEL, "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"A{self.count}"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)


async def _asked(http: httpx.AsyncClient, sessions: Any, messages: list[dict[str, Any]],
                 session: str) -> httpx.Response:
    """One request of ``messages`` through the app, its reply appended to them, once the
    reply's push is stored (the next request may go ahead)."""
    answer = await http.post("/v1/chat/completions", content=_bytes({"model": MODEL, "messages": messages}),
                             headers=_headers(session, 200000))
    assert answer.status_code == 200, answer.text
    messages.append(answer.json()["choices"][0]["message"])
    await sessions.drain()
    return answer


async def _daemon_here(tmp_path: Any, upstream_url: str) -> tuple[Any, Any, Any]:
    """A daemon in this process, the proxy's link to it and its sessions (OpenAI upstream at
    ``upstream_url``)."""
    from ctxd.config import load_config
    from ctxd.embed import open_here
    from ctxd.proxy.inproc import PortLink
    from ctxd.proxy.sessions import Sessions

    config = load_config(None, overrides={"daemon": {"data_dir": str(tmp_path / "data"),
                                                     "socket": str(tmp_path / "run" / "ctxd.sock")},
                                          "proxy": {"openai_base_url": upstream_url}})
    link = PortLink(await open_here(config))
    return config, link, Sessions(link)


async def test_a_request_sent_ahead_is_written_before_its_turn_begins(tmp_path) -> None:
    """In process: when the turn of a request sent ahead begins, the upstream has its
    request already (its turn's CPU would otherwise run before the write). The turn checks
    it blocking the loop: had the request not been written yet, it never would be."""
    from ctxd.proxy import wire
    from ctxd.proxy.app import Proxy, build_app
    from ctxd.proxy.windows import Windows

    upstream = _Recorder()
    config, link, sessions = await _daemon_here(tmp_path, upstream.url)
    seen: list[tuple[bool, bool]] = []
    turn = sessions.turn

    async def checked_turn(conv: Any, fmt: Any) -> Any:
        ahead = conv.early is not None
        # (the n-th request's turn: the upstream's n-th read, n = len(seen))
        seen.append((ahead, upstream.read[len(seen)].wait(2) if ahead else True))
        return await turn(conv, fmt)

    sessions.turn = checked_turn  # type: ignore[method-assign]
    try:
        async with wire.UpstreamTransport(limits=httpx.Limits()) as transport:
            proxy = Proxy(config.proxy, sessions, transport, httpx.Timeout(30), Windows.from_config(config))
            app = build_app(proxy)
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
                for n in range(4):
                    messages.append({"role": "user", "content": f"Turn {n}: and now?"})
                    await _asked(http, sessions, messages, "written")
    finally:
        await link.close()
    assert any(ahead for ahead, _ in seen), seen  # (the case this test is about happened)
    assert all(written for _, written in seen), seen


def test_a_request_sent_ahead_is_checked_once_answered(caplog: pytest.LogCaptureFixture) -> None:
    """Whether ctxd's prompt for a request sent ahead was the client's is checked after the
    answer went out, before its reply is pushed (``Proxy._check_ahead``): the same, the
    session's next request may go ahead too; another (not expected: ``appendRoom`` bounds
    what a request appends), it may not, ctxd's count is not paired with the reply's usage,
    and it is logged."""
    import logging
    from types import SimpleNamespace

    from ctxd.proxy import apis
    from ctxd.proxy.app import Proxy
    from ctxd.proxy.sessions import Sessions, Tracked, conversation

    body = {"model": MODEL, "messages": [{"role": "system", "content": "You are terse."},
                                         {"role": "user", "content": "Hello?"}]}
    parts = apis.split("openai", body)
    proxy = Proxy.__new__(Proxy)
    proxy.sessions = Sessions(SimpleNamespace())  # type: ignore[arg-type]
    for same in (True, False):
        conv = conversation("openai", body, parts, session="checked", window=200000)
        conv.prompt_tokens = 12
        tracked = Tracked("checked", [], "You are terse.")
        conv.changes = tracked.changes  # (as its turn leaves it: no other change told meanwhile)
        rendered = [dict(m) for m in body["messages"]]
        if not same:
            rendered[-1]["content"] = "Hello? (as ctxd has it)"
        conv.ahead = (body, parts, {"messages": rendered, "tokens": 12, "appendRoom": 900,
                                    "budget": {"contextWindow": 200000}})
        with caplog.at_level(logging.WARNING, logger="ctxd.proxy"):
            proxy._check_ahead(conv, tracked, list(tracked.chain))
        assert conv.ahead is None
        if same:
            assert tracked.verbatim is not None and tracked.verbatim.room == 900
            assert conv.prompt_tokens == 12 and DIFFERED not in caplog.text
        else:
            assert tracked.verbatim is None and conv.prompt_tokens is None
            assert DIFFERED in caplog.text


class _Held(httpx.AsyncBaseTransport):
    """An OpenAI upstream in process: answers each chat request (its reply numbered),
    holds one whose last message says ``HOLD`` until released, and answers 429 to one
    that says ``BUSY``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.count = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        last = str(json.loads(request.content)["messages"][-1]["content"])
        self.count += 1
        if "BUSY" in last:
            return httpx.Response(429, json={"error": {"message": "slow down", "type": "rate_limit_error"}})
        if "HOLD" in last:
            self.holding.set()
            await self.release.wait()
        return httpx.Response(200, json={
            "id": f"c{self.count}", "object": "chat.completion", "model": MODEL, "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"A{self.count}"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})


async def _in_process(tmp_path: Any) -> tuple[Any, Any, Any, _Held]:
    """The proxy's app on a daemon in this process, its upstream :class:`_Held`."""
    from ctxd.proxy.app import Proxy
    from ctxd.proxy.windows import Windows

    config, link, sessions = await _daemon_here(tmp_path, "http://upstream.invalid/v1")
    upstream = _Held()
    proxy = Proxy(config.proxy, sessions, upstream, httpx.Timeout(30), Windows.from_config(config))
    return link, sessions, proxy, upstream


async def test_a_request_answered_after_a_later_turn_leaves_that_turns_state(tmp_path: Any) -> None:
    """A request sent ahead whose answer comes after a later request of its session took
    its turn: its check (after its answer) leaves the session as that turn left it, so a
    next request goes ahead only within the later prompt's room."""
    from ctxd.proxy.app import build_app

    link, sessions, proxy, upstream = await _in_process(tmp_path)
    early: list[bool] = []
    decide = sessions.early
    sessions.early = lambda *a: early.append(decide(*a)) or early[-1]  # type: ignore[method-assign]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(proxy)),
                                     base_url="http://127.0.0.1", timeout=30) as http:
            async def post(conversation: list[dict[str, Any]]) -> httpx.Response:
                return await http.post("/v1/chat/completions", headers=_headers("later", 200000),
                                       content=_bytes({"model": MODEL, "messages": conversation}))

            for n in range(4):
                messages.append({"role": "user", "content": f"Turn {n}: and now?"})
                answer = await post(messages)
                assert answer.status_code == 200
                messages.append(answer.json()["choices"][0]["message"])
                await sessions.drain()
            tracked = next(iter(sessions._tracked.values()))
            first = messages + [{"role": "user", "content": "HOLD this one."}]
            held = asyncio.create_task(post(first))
            await upstream.holding.wait()
            while tracked.lock.locked() or len(tracked.entries) < len(first) - 1:  # (its turn done)
                await asyncio.sleep(0.01)
            assert early[-1] is True
            second = first + [{"role": "user", "content": "And more: " + "word " * 3000}]
            answer = await post(second)
            assert answer.status_code == 200
            await sessions.drain()
            later = tracked.verbatim
            assert later is not None
            upstream.release.set()
            assert (await held).status_code == 200
            await sessions.drain()
            assert tracked.verbatim is later
            # What the later prompt leaves no room for does not go ahead.
            third = second + [answer.json()["choices"][0]["message"],
                              {"role": "user", "content": "z" * (later.room + 1500)}]
            assert (await post(third)).status_code == 200
            assert early[-1] is False
    finally:
        await sessions.drain()
        await link.close()


async def test_a_request_sent_ahead_is_checked_after_its_answer_went_out(tmp_path: Any) -> None:
    """The check of a request sent ahead runs once its answer's last byte is handed on, an
    error answer's too (a retry after a 429 goes ahead again)."""
    from ctxd.proxy.app import build_app

    link, sessions, proxy, upstream = await _in_process(tmp_path)
    events: list[str] = []
    check = proxy._check_ahead

    def checked(conv: Any, tracked: Any, chain_then: Any) -> None:
        events.append("checked" if conv.ahead is not None else "nothing to check")
        check(conv, tracked, chain_then)

    proxy._check_ahead = checked  # type: ignore[method-assign]
    early: list[bool] = []
    decide = sessions.early
    sessions.early = lambda *a: early.append(decide(*a)) or early[-1]  # type: ignore[method-assign]
    app = build_app(proxy)

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        async def sent(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                events.append("answered")
        await app(scope, receive, sent)

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=recorded), base_url="http://127.0.0.1",
                                     timeout=30) as http:
            for n in range(5):
                events.clear()
                messages.append({"role": "user", "content": f"Turn {n}: and now?"})
                answer = await http.post("/v1/chat/completions", headers=_headers("order", 200000),
                                         content=_bytes({"model": MODEL, "messages": messages}))
                assert answer.status_code == 200
                messages.append(answer.json()["choices"][0]["message"])
                await sessions.drain()
            assert early[-1] is True and events[:2] == ["answered", "checked"], events
            events.clear()
            busy = messages + [{"role": "user", "content": "BUSY?"}]
            answer = await http.post("/v1/chat/completions", headers=_headers("order", 200000),
                                     content=_bytes({"model": MODEL, "messages": busy}))
            assert answer.status_code == 429
            assert early[-1] is True and events == ["answered", "checked"], events
            answer = await http.post("/v1/chat/completions", headers=_headers("order", 200000),
                                     content=_bytes({"model": MODEL, "messages": busy}))
            assert answer.status_code == 429 and early[-1] is True  # (the retry went ahead too)
    finally:
        await sessions.drain()
        await link.close()


async def test_a_client_appending_byte_for_byte_is_read_from_its_new_bytes(tmp_path) -> None:
    """In process, through the app: an agent resending its conversation with messages
    appended is read from its new bytes (``bodies.py``), each request goes ahead, and the
    session holds the conversation as sent; one that edits an earlier message is read
    whole, its edit stored."""
    from ctxd.proxy import wire
    from ctxd.proxy.app import Proxy, build_app
    from ctxd.proxy.windows import Windows

    upstream = _Recorder()
    config, link, sessions = await _daemon_here(tmp_path, upstream.url)
    ahead: list[bool] = []
    turn = sessions.turn

    async def noted_turn(conv: Any, fmt: Any) -> Any:
        ahead.append(conv.early is not None)
        return await turn(conv, fmt)

    sessions.turn = noted_turn  # type: ignore[method-assign]
    try:
        async with wire.UpstreamTransport(limits=httpx.Limits()) as transport:
            proxy = Proxy(config.proxy, sessions, transport, httpx.Timeout(30), Windows.from_config(config))
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(proxy)),
                                         base_url="http://127.0.0.1") as http:
                for n in range(7):
                    if n == 6:
                        messages[1] = {"role": "user", "content": "Turn 0, said otherwise"}
                    messages.append({"role": "user", "content": f"Turn {n}: and now? \u00e9\u6f22 \"q\""})
                    answer = await _asked(http, sessions, messages, "appended")
                assert proxy.bodies.hits == 5
                named = answer.headers["x-ctxd-session"]  # (the edit's session: a fork of it)
                stored = await link.request(named, "session/history", {"sessionId": named, "limit": 100})
    finally:
        await link.close()
    assert ahead[2:6] == [True] * 4, ahead  # (the second goes ahead once the first turn said its room)
    texts = [e["message"]["content"] if isinstance(e["message"]["content"], str) else
             "".join(p.get("text", "") for p in e["message"]["content"]) for e in stored["messages"]
             if e["status"] != "superseded"]
    # (the edited message supersedes the one it replaces, stored after: the client's working context)
    assert sorted(texts) == sorted(m["content"] for m in messages[1:]), texts
