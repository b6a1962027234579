"""What the proxy skips on a request's path changes nothing the upstream or the client
sees: a body ctxd leaves as it is goes upstream in the client's own bytes; one ctxd
changes is encoded from ctxd's prompt as before."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.proxy.conftest import ctxd_client
from tests.proxy.upstream import MODEL

HEADERS = {"authorization": "Bearer sk-test", "x-ctxd-session": "hot-path", "x-ctxd-context-window": "200000",
           "content-type": "application/json"}


def _bytes(body: dict[str, Any]) -> bytes:
    """The client's own encoding: indented, non-ASCII escaped, keys in its order (not what
    the proxy's encoder writes)."""
    return json.dumps(body, indent=2, ensure_ascii=True).encode()


async def test_a_body_ctxd_leaves_as_it_is_goes_upstream_in_the_clients_bytes(proxy, upstream, ctxd_daemon) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "Caf\u00e9 au lait, s'il vous pla\u00eet?"}]
    async with httpx.AsyncClient(timeout=30) as http:
        sent = []
        for turn in range(3):
            body = {"model": MODEL, "temperature": 0.5, "messages": messages}
            sent.append(_bytes(body))
            answer = await http.post(proxy.url + "/v1/chat/completions", content=sent[-1], headers=HEADERS)
            assert answer.status_code == 200, answer.text
            messages = [*messages, answer.json()["choices"][0]["message"],
                        {"role": "user", "content": f"And turn {turn}: \u00fcber alles?"}]
        received = upstream.chats("/v1/chat/completions")
        assert [r.body for r in received] == sent
        assert received[-1].headers["content-type"] == "application/json"

        # Once ctxd's prompt is not the client's (a goal: ctxd's system text adds it), the
        # body is ctxd's, encoded as before.
        client = await ctxd_client(ctxd_daemon)
        try:
            await client.request("goal/set", {"sessionId": "hot-path", "description": "Check every module."})
        finally:
            await client.close()
        body = {"model": MODEL, "temperature": 0.5, "messages": messages}
        answer = await http.post(proxy.url + "/v1/chat/completions", content=_bytes(body), headers=HEADERS)
        assert answer.status_code == 200, answer.text
    last = upstream.chats("/v1/chat/completions")[-1]
    assert last.body != _bytes(body)
    assert last.json["messages"][0] == messages[0]
    assert "Check every module." in last.json["messages"][1]["content"]
    assert last.json["messages"][2:] == messages[1:]
    assert last.json["temperature"] == 0.5


def test_unchanged_means_the_clients_own_objects_and_fields() -> None:
    from ctxd.proxy.apis import unchanged

    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    body = {"model": MODEL, "messages": messages, "system": [{"type": "text", "text": "s"}]}
    assert unchanged("anthropic", body, body)
    assert unchanged("anthropic", body, dict(body, messages=list(messages), system=[{"type": "text", "text": "s"}]))
    # An equal copy of a message is ctxd's rendering, not the client's object: encoded again.
    assert not unchanged("anthropic", body, dict(body, messages=[dict(messages[0]), messages[1]]))
    assert not unchanged("anthropic", body, dict(body, messages=messages[:1]))
    assert not unchanged("anthropic", body, dict(body, system="s"))
    assert not unchanged("anthropic", body, {k: v for k, v in body.items() if k != "system"})
    assert not unchanged("openai", body, dict(body, model="other"))
    assert unchanged("responses", {"input": messages}, {"input": list(messages)})
    assert not unchanged("responses", {"input": "a"}, {"input": [messages[0]]})


async def test_the_answer_goes_out_before_its_reply_is_read_and_pushed(monkeypatch) -> None:
    """The answer's write, queued on the loop by uvicorn's send, runs before the reply of
    the answer is decoded and its push prepared (Starlette runs the push right after the
    send, in the same task)."""
    import asyncio

    from ctxd.proxy import apis
    from ctxd.proxy.app import Proxy

    events: list[str] = []
    read = apis.reply_of
    monkeypatch.setattr(apis, "reply_of", lambda api, body: (events.append("reply read"), read(api, body))[1])

    class Pushes:
        async def push_reply(self, tracked: Any, chain: Any, conv: Any, messages: Any, usage: Any) -> bool:
            events.append(f"pushed {messages[0]['content']}")
            return True

    proxy = Proxy.__new__(Proxy)
    proxy.sessions = Pushes()  # type: ignore[assignment]
    answer = httpx.Response(200, json={"id": "c1", "object": "chat.completion", "model": MODEL, "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi."}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
    asyncio.get_running_loop().call_soon(events.append, "answer written")
    await proxy._push_whole("openai", None, None, [], answer)  # type: ignore[arg-type]
    assert events == ["answer written", "reply read", "pushed Hi."]
