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
    from types import SimpleNamespace

    conv = SimpleNamespace(ahead=None)  # (not sent ahead of its turn: nothing to check)
    await proxy._push_whole("openai", conv, None, [], answer)  # type: ignore[arg-type]
    assert events == ["answer written", "reply read", "pushed Hi."]


def _random_case(rng: Any) -> tuple[list[Any], list[Any]]:
    from ctxd.proxy.identity import Ident, Stored

    pool = [f"id{k}" for k in range(6)]
    stored = [Stored(f"h{i}", rng.choice(pool), rng.random() < 0.4, f"s{rng.randrange(3)}", rng.random() < 0.85)
              for i in range(rng.randrange(8))]
    live = [s.ident for s in stored if s.live]
    if rng.random() < 0.5:  # the usual request: the session's live messages, then new ones
        client = [Ident(k, rng.random() < 0.3, f"s{rng.randrange(3)}") for k in live]
    else:
        client = [Ident(rng.choice(pool), rng.random() < 0.3, f"s{rng.randrange(3)}") for _ in range(len(live))]
    client += [Ident(rng.choice(pool), rng.random() < 0.3, f"s{rng.randrange(3)}") for _ in range(rng.randrange(3))]
    return stored, client


def test_match_and_each_messages_side_are_what_they_were_message_by_message() -> None:
    """The C-level forms of ``match``'s usual case and of the per-message shapes and
    anchors give what the comprehensions they replace gave, on random sessions."""
    import random

    from ctxd.proxy.identity import Plan, match, stored_sides

    rng = random.Random(7)
    extended = 0
    for _ in range(3000):
        stored, client = _random_case(rng)
        if rng.random() < 0.3:
            client = client[:rng.randrange(len(client) + 1)]
        plan = match(stored, client)
        live = [i for i, s in enumerate(stored) if s.live]
        usual = len(client) >= len(live) and all(stored[i].ident == client[j].key for j, i in enumerate(live))
        assert (plan is not None and plan.extends) == usual
        if usual:
            assert plan == Plan(new=list(range(len(live), len(client))), matched=dict(enumerate(live)), extends=True)
            extended += 1
        if plan is None:
            continue
        plan.anchors = {k for k in (c.key for c in client) if rng.random() < 0.3}
        shapes, anchors = stored_sides(stored, plan, client)
        assert shapes == [stored[plan.matched[j]].shape if j in plan.matched else ident.shape
                          for j, ident in enumerate(client)]
        assert anchors == [stored[plan.matched[j]].anchor if j in plan.matched
                           else ident.ids or ident.key in plan.anchors for j, ident in enumerate(client)]
    assert 500 < extended < 3000


def test_the_order_of_a_request_whose_messages_are_all_ctxds_is_the_general_one() -> None:
    """``order_of``'s shortcut (every client message is one of ctxd's items) builds what its
    general loop builds, and the loop still serves a request with messages ctxd skips."""
    import random

    from ctxd.proxy import app
    from ctxd.proxy.apis import Split
    from ctxd.proxy.identity import Ident, Plan
    from ctxd.proxy.sessions import Conversation

    def general(conv: Conversation) -> Any:
        idents, shapes, anchors = [], [], []
        for i in range(len(conv.parts.conversation)):
            taken = conv.counts[i + 1] > conv.counts[i]
            idents.append(conv.idents[conv.counts[i]] if taken else None)
            shapes.append(conv.shapes[conv.counts[i]] if taken else None)
            anchors.append(conv.anchors[conv.counts[i]] if taken else False)
        return idents, shapes, anchors

    rng = random.Random(3)
    for skipped in (False, True):
        for _ in range(200):
            n = rng.randrange(1, 12)
            taken = [not skipped or rng.random() < 0.7 for _ in range(n)]
            counts = [0]
            for t in taken:
                counts.append(counts[-1] + t)
            items = counts[-1]
            conv = Conversation("openai", MODEL, "s", True, None, Split("", [], [{"role": "user"}] * n), [], [],
                                [Ident(f"k{i}", False, f"s{i}") for i in range(items)], counts)
            conv.plan, conv.shapes = Plan(new=[], extends=rng.random() < 0.5), [f"s{i}" for i in range(items)]
            conv.anchors = [rng.random() < 0.5 for _ in range(items)]
            order = app.order_of(conv)
            assert order is not None
            assert (order.idents, order.shapes, order.anchors) == general(conv)
            assert order.extends == conv.plan.extends


async def test_the_upstream_gets_the_clients_headers_as_sent_but_the_proxys_own(proxy, upstream) -> None:
    """Whether the request goes ahead of its turn (the second, third) or after it (the
    first): each header the client sent, a repeated one each time in its order, and its
    query; not the hop-by-hop ones nor ``X-Ctxd-*``; the JSON type, and ``identity`` asked
    of the answer the proxy reads."""
    headers = [("authorization", "Bearer sk-test"), ("x-ctxd-session", "forwarded-headers"),
               ("x-ctxd-context-window", "200000"), ("x-client-tag", "first"), ("accept-encoding", "gzip, br"),
               ("content-type", "application/json; charset=utf-8"), ("x-client-tag", "second"),
               ("openai-organization", "org-1")]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hello?"}]
    async with httpx.AsyncClient(timeout=30) as http:
        for turn in range(3):
            answer = await http.post(proxy.url + "/v1/chat/completions?api-version=2024-10-01&tag=a&tag=b&flag",
                                     headers=headers,
                                     content=json.dumps({"model": MODEL, "messages": messages}).encode())
            assert answer.status_code == 200, answer.text
            messages = [*messages, answer.json()["choices"][0]["message"], {"role": "user", "content": f"And {turn}?"}]
    received = upstream.chats("/v1/chat/completions")
    assert len(received) == 3
    for r in received:
        assert r.query == "api-version=2024-10-01&tag=a&tag=b&flag"
        names = [k.lower() for k, _ in r.raw_headers]
        assert not [n for n in names if n.startswith("x-ctxd-")], r.raw_headers
        assert [v for k, v in r.raw_headers if k.lower() == "x-client-tag"] == ["first", "second"]
        assert [v for k, v in r.raw_headers if k.lower() == "accept-encoding"] == ["identity"]
        assert [v for k, v in r.raw_headers if k.lower() == "content-type"] == ["application/json"]
        assert r.headers["authorization"] == "Bearer sk-test" and r.headers["openai-organization"] == "org-1"
        assert names.count("host") == 1 and names.count("content-length") == 1
