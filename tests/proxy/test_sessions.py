"""Sessions through the proxy: concurrent conversations, a history the client changed, a
proxy restart, and a long conversation in an 8K window."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import openai
import pytest

from ctxd.engine.validate import validate_openai
from ctxd.protocol.providers import OpenAIMessage
from ctxd.tokens import TokenCounter
from tests.proxy.conftest import both_modes, ctxd_client, history, sessions
from tests.proxy.upstream import MODEL

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def sdk(proxy, **headers) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                              default_headers=headers or None)


async def _talk(client: openai.AsyncOpenAI, first: str, turns: int, *, stream: bool) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "Agent."}, {"role": "user", "content": first}]
    for turn in range(turns):
        if stream:
            text = ""
            async for chunk in await client.chat.completions.create(model=MODEL, messages=messages, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
        else:
            reply = await client.chat.completions.create(model=MODEL, messages=messages)
            text = reply.choices[0].message.content
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"{first} turn {turn}"}]
    return messages


@both_modes
async def test_two_conversations_at_once_never_mix(proxy, ctxd_daemon) -> None:
    client = sdk(proxy)
    a, b = await asyncio.gather(_talk(client, "Conversation A", 4, stream=True),
                                _talk(client, "Conversation B", 4, stream=False))
    found = {s["title"]: s["sessionId"] for s in await sessions(ctxd_daemon)}
    assert set(found) == {"Conversation A", "Conversation B"}
    for title, messages in (("Conversation A", a), ("Conversation B", b)):
        stored = await history(ctxd_daemon, found[title])
        # Every client message sent once, in order, and each reply (the last request's too;
        # the last user message of ``messages`` was never sent).
        assert [m.get("content") for m in stored] == [m["content"] for m in messages[1:-1]]


@both_modes
async def test_edited_history_continues_in_a_linked_session(proxy, ctxd_daemon) -> None:
    client = sdk(proxy, **{"X-Ctxd-Session": "task-1"})
    messages = await _talk(client, "Start the task.", 2, stream=False)
    # The agent compacts: its history now differs from the session's.
    edited = [messages[0], {"role": "user", "content": "Start the task."},
              {"role": "assistant", "content": "Summary of the work so far."}, messages[-1]]
    await client.chat.completions.create(model=MODEL, messages=edited)
    old = await history(ctxd_daemon, "task-1")
    new = await history(ctxd_daemon, "task-1~2")
    assert len(old) == 4  # untouched: the two requests and their replies
    assert [m["content"] for m in new] == [m["content"] for m in edited[1:]] + ["Answer to: Start the task. turn 1"]
    infos = {s["sessionId"]: s for s in await sessions(ctxd_daemon)}
    assert infos["task-1"]["metadata"]["ctxdProxy"]["successor"] == "task-1~2"
    assert infos["task-1~2"]["metadata"]["ctxdProxy"]["forkedFrom"] == "task-1"
    assert "differs from the session's" in proxy.log()
    # The conversation goes on in the new session.
    edited += [{"role": "assistant", "content": "Answer to: Start the task. turn 1"},
               {"role": "user", "content": "Next."}]
    await client.chat.completions.create(model=MODEL, messages=edited)
    assert len(await history(ctxd_daemon, "task-1~2")) == 6
    assert len(await history(ctxd_daemon, "task-1")) == 4


@both_modes
@pytest.mark.parametrize("named", [True, False])
async def test_a_client_back_on_the_branch_it_left_continues_that_session(start_proxy, ctxd_daemon,
                                                                          named: bool) -> None:
    """After a fork, a request whose history extends the first session again (the agent's
    history as it was before the edit, another window of it) goes on in that session, for
    a session named by X-Ctxd-Session as for a derived one; also after a proxy restart."""
    headers = {"X-Ctxd-Session": "branch"} if named else {}
    proxy = start_proxy()
    client = sdk(proxy, **headers)
    messages = await _talk(client, "Branch out.", 2, stream=False)
    [first] = [s["sessionId"] for s in await sessions(ctxd_daemon)]
    edited = [messages[0], {"role": "user", "content": "Branch out."},
              {"role": "assistant", "content": "An edited answer."}, messages[-1]]
    await client.chat.completions.create(model=MODEL, messages=edited)
    fork = f"{first}~2"
    assert len(await history(ctxd_daemon, fork)) == 4
    # Back on the first branch: its whole history, a reply and a new question.
    back = messages + [{"role": "assistant", "content": "Answer to: Branch out. turn 1"},
                       {"role": "user", "content": "Back on the first branch."}]
    await client.chat.completions.create(model=MODEL, messages=back)
    assert [m["content"] for m in await history(ctxd_daemon, first)][-2:] == \
        ["Back on the first branch.", "Answer to: Back on the first branch."]
    assert len(await history(ctxd_daemon, fork)) == 4
    # The fork's branch goes on in the fork; a restarted proxy finds both the same way.
    proxy.stop()
    client = sdk(start_proxy(), **headers)
    more = edited + [{"role": "assistant", "content": "Answer to: Branch out. turn 1"},
                     {"role": "user", "content": "On the edited branch."}]
    await client.chat.completions.create(model=MODEL, messages=more)
    back += [{"role": "assistant", "content": "Answer to: Back on the first branch."},
             {"role": "user", "content": "Still on the first."}]
    await client.chat.completions.create(model=MODEL, messages=back)
    ids = sorted(s["sessionId"] for s in await sessions(ctxd_daemon))
    assert ids == sorted([first, fork])
    assert len(await history(ctxd_daemon, fork)) == 6 and len(await history(ctxd_daemon, first)) == 10


@both_modes
async def test_a_restarted_proxy_pushes_nothing_twice(start_proxy, ctxd_daemon) -> None:
    first = start_proxy()
    messages = await _talk(sdk(first), "Survive a restart.", 2, stream=False)
    first.stop()
    second = start_proxy()
    await sdk(second).chat.completions.create(model=MODEL, messages=messages)
    [info] = await sessions(ctxd_daemon)
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["content"] for m in stored] == [m["content"] for m in messages[1:]] + \
        ["Answer to: Survive a restart. turn 1"]


@pytest.mark.slow
@pytest.mark.timeout(900)  # 600 requests; the openai SDK's own work on a long history is most of it (~110 s)
async def test_a_300_turn_conversation_in_an_8k_window(proxy, upstream, ctxd_daemon) -> None:
    """Every upstream request fits and is valid for the provider; every user message said
    so far is in it, verbatim, as long as they take at most half the budget (ctxd's count
    of them against the max prompt, asked after each request; past that, the oldest are
    folded), and the newest always is."""
    client = sdk(proxy, **{"X-Ctxd-Context-Window": "8192"})
    counter = TokenCounter.for_model("gpt-4o")
    output = " ".join(f"line {i}: build step finished, file src/module_{i}.py compiled" for i in range(12))
    messages: list[dict] = [{"role": "system", "content": "You are a build agent."}]
    users: list[str] = []
    within_half: list[bool] = []  # per request: the user's messages took at most half the max prompt
    ctxd = await ctxd_client(ctxd_daemon)
    session_id = ""

    async def ask(**extra) -> Any:
        nonlocal session_id
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, **extra)
        if not session_id:
            [info] = await sessions(ctxd_daemon)
            session_id = info["sessionId"]
        stats = await ctxd.request("context/stats", {"sessionId": session_id})
        within_half.append(2 * stats["byRole"]["user"]["tokens"] <= stats["budget"]["maxPromptTokens"])
        return reply

    try:
        for turn in range(300):
            users.append(f"Request {turn}: please use the tool to check the build of module {turn}.")
            messages.append({"role": "user", "content": users[-1]})
            reply = await ask()
            call = reply.choices[0].message.tool_calls[0]
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{output} (turn {turn})"})
            reply = await ask()
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    finally:
        await ctxd.close()
    client_tokens = sum(counter.count(str(m.get("content") or "")) for m in messages)
    assert client_tokens > 4 * 8192  # the client's history is far beyond the window
    sent = upstream.chats("/v1/chat/completions")
    assert len(sent) == 600
    [info] = await sessions(ctxd_daemon)
    assert info["contextWindow"] == 8192 and info["compressionCount"] >= 1
    for n, request in enumerate(sent):
        typed = msgspec.convert(request.json["messages"], list[OpenAIMessage])
        assert validate_openai(typed) == []
        tokens = sum(counter.count(m.content or "") + sum(counter.count(c.function.arguments)
                                                          for c in m.tool_calls or ()) for m in typed)
        assert tokens < 8192
        text = "\n".join(m.content or "" for m in typed)
        said = n // 2 + 1
        assert users[said - 1] in text and request.json["messages"][-1]["role"] in ("user", "tool")
        if within_half[n]:
            assert all(u in text for u in users[:said]), f"request {n}: a user message is missing"
    assert sum(within_half) >= 100  # the rule was checked on many requests, not vacuously



async def test_sessions_beyond_the_bound_are_forgotten_and_read_again(tmp_path) -> None:
    """The proxy keeps the chains of at most ``Sessions.TRACKED`` sessions (the least
    recently used idle ones go); a forgotten conversation that comes back is read again
    from history and continues, nothing pushed twice. In process, the daemon too."""
    from ctxd.config import load_config
    from ctxd.embed import open_here
    from ctxd.proxy.apis import split
    from ctxd.proxy.inproc import PortLink
    from ctxd.proxy.sessions import Sessions

    config = load_config(None, overrides={"daemon": {"data_dir": str(tmp_path / "data"),
                                                     "socket": str(tmp_path / "run" / "ctxd.sock")}})
    link = PortLink(await open_here(config))
    sessions_ = Sessions(link)
    sessions_.TRACKED = 4
    histories: dict[str, list[dict[str, Any]]] = {}

    async def turn(name: str) -> None:
        messages = histories.setdefault(name, [{"role": "system", "content": "Agent."}])
        messages.append({"role": "user", "content": f"{name}, request {len(messages)}"})
        body = {"model": MODEL, "messages": messages}
        conv = sessions_.read("openai", body, split("openai", body), session=name, window=None)
        tracked, chain, _ = await sessions_.turn(conv, "openai")
        await sessions_.push_reply(tracked, chain, conv, [{"role": "assistant", "content": f"to {name}"}], {})
        messages.append({"role": "assistant", "content": f"to {name}"})

    try:
        for _ in range(3):
            for n in range(8):
                await turn(f"s{n}")
                assert len(sessions_._tracked) <= sessions_.TRACKED + 1
        await sessions_.drain()
        for n in range(8):
            info = await link.request(f"s{n}", "session/get", {"sessionId": f"s{n}"})
            assert info["messageCount"] == 6  # 3 requests and their replies, none twice
    finally:
        await sessions_.drain()
        await link.close()


async def test_the_users_typed_text_reaches_the_upstream_whole(proxy, upstream, ctxd_daemon) -> None:
    """What a user types reaches the upstream byte for byte, whatever it looks like: a
    trailing ``[shares a photo: a lake]`` was cut off every user message behind the
    compression boundary (a pattern written for one data set's importer, issue 24)."""
    client = sdk(proxy, **{"X-Ctxd-Context-Window": "4096"})
    output = " ".join(f"line {i}: build step finished, file src/module_{i}.py compiled" for i in range(40))
    messages: list[dict] = [{"role": "system", "content": "You are a build agent."}]
    users: list[str] = []
    for turn in range(30):
        users.append(f"Request {turn}: please use the tool for module {turn} [shares a photo: a lake at dawn]")
        messages.append({"role": "user", "content": users[-1]})
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        call = reply.choices[0].message.tool_calls[0]
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{output} (turn {turn})"})
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    [info] = await sessions(ctxd_daemon)
    assert info["compressionCount"] >= 2
    ctxd = await ctxd_client(ctxd_daemon)
    try:
        checkpoints = (await ctxd.request("context/checkpoints", {"sessionId": info["sessionId"]}))["checkpoints"]
    finally:
        await ctxd.close()
    assert any(c["kind"] == "summary" for c in checkpoints)  # the early user messages are behind the boundary
    sent = upstream.chats("/v1/chat/completions")
    for n, request in enumerate(sent):
        text = "\n".join(m.get("content") or "" for m in request.json["messages"])
        assert all(u in text for u in users[:n // 2 + 1]), f"request {n}: a user message was not sent whole"


async def test_a_new_sessions_first_request_is_two_daemon_round_trips(tmp_path) -> None:
    """A new session's first request creates it with everything it holds (the key's
    fingerprint, the settings, the samples learned for the client and model) without
    asking first whether it exists, and gets its prompt with the push: no listing of every
    session for a name a client chose, no update after the create, and in storage no read,
    three writes (the session, the push, the pins of what the client shows). A session
    this proxy does not know (a restart) is read when the create finds it. In process."""
    from ctxd.config import load_config
    from ctxd.embed import open_here
    from ctxd.proxy.apis import split
    from ctxd.proxy.inproc import PortLink
    from ctxd.proxy.sessions import META, Refused, Sessions

    config = load_config(None, overrides={"daemon": {"data_dir": str(tmp_path / "data"),
                                                     "socket": str(tmp_path / "run" / "ctxd.sock")}})
    here = await open_here(config)
    link = PortLink(here)
    sessions_ = Sessions(link)
    asked: list[str] = []
    request = link.request

    async def counted(session_id: str, method: str, params: Any) -> Any:
        asked.append(method)
        return await request(session_id, method, params)

    link.request = counted  # type: ignore[method-assign]
    db = here.daemon.service.db  # type: ignore[attr-defined]
    read, write = db.read, db.write

    async def counted_read(fn: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append("read")
        return await read(fn, *args, **kwargs)

    async def counted_write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append("write")
        return await write(fn, *args, **kwargs)

    db.read, db.write = counted_read, counted_write

    async def first(proxy: Sessions, name: str | None, text: str, key: str = "key-a", *more: str) -> Any:
        messages = [{"role": "system", "content": "Agent."}, {"role": "user", "content": text}]
        for said in more:
            messages += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": said}]
        body = {"model": MODEL, "messages": messages}
        conv = proxy.read("openai", body, split("openai", body), session=name, window=32000, output=2000,
                          credential=key, user_agent="bench/1.0")
        asked.clear()
        tracked, chain, _ = await proxy.turn(conv, "openai")
        made = list(asked)
        await proxy.push_reply(tracked, chain, conv, [{"role": "assistant", "content": "Done."}],
                               {"inputTokens": 900, "outputTokens": 3})
        await proxy.drain()
        return tracked, made

    try:
        for n in range(12):
            await first(sessions_, f"task-{n}", f"Task {n}.")
            await first(sessions_, None, f"Derived {n}.")
        new = ["session/create", "write", "context/prompt", "write", "write"]
        tracked, made = await first(sessions_, "bench-ttfb-1", "One more.")
        assert made == new
        _, made = await first(sessions_, None, "And a derived one.")
        assert made == new
        info = await request(tracked.id, "session/get", {"sessionId": tracked.id})
        assert info["metadata"][META]["credential"] == "key-a"
        assert info["settings"]["outputTokens"] == 2000 and info["settings"]["outputFloor"] == 4000
        assert info["messageCount"] == 2 and info["systemPrompt"] == "Agent."
        stats = await request(tracked.id, "context/stats", {"sessionId": tracked.id})
        assert len(stats["usageDrift"]["samples"]) > 1  # the client's earlier sessions' pairs came along
        assert stats["pinned"] == [1]  # the client's first message, pinned as what it shows

        # A restarted proxy: the session it does not know is found by its create.
        again = Sessions(link)
        with pytest.raises(Refused) as refused:
            await first(again, "bench-ttfb-1", "One more.", "key-b", "Next.")
        assert refused.value.status == 403
        # (the samples of its client and model looked up first, once per profile)
        assert [m for m in asked if "/" in m] == ["session/list", "context/stats", "session/create", "session/get",
                                                  "session/history"]
        await first(again, "bench-ttfb-1", "One more.", "key-a", "Next.")
        info = await request(tracked.id, "session/get", {"sessionId": tracked.id})
        assert info["messageCount"] == 4 and info["metadata"][META]["credential"] == "key-a"
    finally:
        await sessions_.drain()
        await link.close()
