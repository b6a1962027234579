"""The reply's push is sent without waiting for its answer (the client gets its reply
meanwhile), and the session's next request waits for that answer before it does
anything: the reply is stored before the next turn's messages, and a push that failed is
made good by the next turn (the client's copy of the reply). The proxy's session layer
in this process, against a real daemon."""

from __future__ import annotations

from typing import Any

from ctxd.proxy.apis import split
from ctxd.proxy.sessions import Conversation, DaemonLink, Sessions, Tracked
from tests.proxy.conftest import history
from tests.proxy.upstream import MODEL

USAGE = {"inputTokens": 12, "outputTokens": 3}


def _read(sessions: Sessions, messages: list[dict[str, Any]]) -> Conversation:
    body = {"model": MODEL, "messages": messages}
    return sessions.read("openai", body, split("openai", body), session="reply-push", window=None)


async def _first_turn(sessions: Sessions) -> tuple[list[dict[str, Any]], Conversation, Tracked, list[str]]:
    first = [{"role": "user", "content": "one"}]
    conv = _read(sessions, first)
    tracked, chain, _ = await sessions.turn(conv, "openai")
    return first, conv, tracked, chain


async def test_the_reply_is_stored_before_the_next_turn_without_being_waited_for(ctxd_daemon) -> None:
    sessions = Sessions(DaemonLink(ctxd_daemon.socket_path, autostart=False))
    try:
        first, conv, tracked, chain = await _first_turn(sessions)
        reply = {"role": "assistant", "content": "the first answer"}
        assert await sessions.push_reply(tracked, chain, conv, [reply], USAGE)
        assert tracked.pending is not None  # sent; its answer is not awaited by the request that got the reply
        second = _read(sessions, [*first, reply, {"role": "user", "content": "two"}])
        _, _, prompt = await sessions.turn(second, "openai")
        assert [m["content"] for m in prompt["messages"]] == ["one", "the first answer", "two"]
        stored = await history(ctxd_daemon, "reply-push")
        assert [m["content"] for m in stored] == ["one", "the first answer", "two"]
        assert stored[1]["usage"]["inputTokens"] == 12  # the proxy's push, not the client's copy
    finally:
        await sessions.drain()
        await sessions.link.close()


async def test_a_failed_reply_push_is_made_good_by_the_next_turn(ctxd_daemon) -> None:
    sessions = Sessions(DaemonLink(ctxd_daemon.socket_path, autostart=False))
    try:
        first, conv, tracked, chain = await _first_turn(sessions)
        ctxd_daemon.stop()  # the reply's push cannot reach it
        reply = {"role": "assistant", "content": "the first answer"}
        assert await sessions.push_reply(tracked, chain, conv, [reply], USAGE)
        await sessions.drain()
        ctxd_daemon.start()
        second = _read(sessions, [*first, reply, {"role": "user", "content": "two"}])
        _, _, prompt = await sessions.turn(second, "openai")
        assert [m["content"] for m in prompt["messages"]] == ["one", "the first answer", "two"]
        stored = await history(ctxd_daemon, "reply-push")
        assert [m["content"] for m in stored] == ["one", "the first answer", "two"]
        assert "usage" not in stored[1]  # the client's copy: it carries no usage
    finally:
        await sessions.drain()
        await sessions.link.close()
