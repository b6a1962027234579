"""The request's reply limit through ``ctxd proxy``: the session reserves it
(``settings.outputTokens``), so a conversation asking for long replies gets a smaller prompt
upstream, and every request's prompt plus its ``max_tokens`` fits the window."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai

from tests.e2e.helpers import db_query
from tests.proxy.conftest import both_modes, ctxd_client, sessions
from tests.proxy.upstream import MODEL

WINDOW = 8192
SYSTEM = "You are a careful agent."
FLOOR = 4096  # proxy.reply_floor_tokens (the proxy creates its sessions with it: test_reply_floor.py)
FLOOR_AT_WINDOW = 1024  # the same at WINDOW: an eighth of it, at least 1,024
TOPICS = ("the parser", "the scheduler", "the cache", "the network layer", "the storage engine", "the test suite")


def _question(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return (f"Turn {turn}: please review {topic} again. " + " ".join(
        f"Check that step {i} of {topic} handles empty input, retries once on failure, logs the error "
        f"with its cause and leaves the previous state untouched." for i in range(6)))


def _provider_count(body: dict) -> int:
    """The prompt as the fake upstream counts it (its ``usage.input_tokens``)."""
    return len(json.dumps(body.get("messages"))) // 4


async def _talk(client: anthropic.AsyncAnthropic, max_tokens: int, turns: int) -> None:
    messages: list[dict] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": _question(turn)})
        reply = await client.messages.create(model=MODEL, max_tokens=max_tokens, system=SYSTEM, messages=messages)
        messages.append({"role": "assistant", "content": reply.content[0].text})


@both_modes
async def test_a_large_max_tokens_gets_a_smaller_prompt(proxy, upstream, ctxd_daemon) -> None:
    def sdk(name: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0, default_headers={
            "X-Ctxd-Session": name, "X-Ctxd-Context-Window": str(WINDOW)})

    async with sdk("short-replies") as short, sdk("long-replies") as long:
        await asyncio.gather(_talk(short, 200, 40), _talk(long, 2000, 40))

    sent: dict[str, list[int]] = {"short-replies": [], "long-replies": []}
    for request in upstream.chats("/v1/messages"):
        max_tokens = request.json["max_tokens"]  # the client's, forwarded as it was
        name = "short-replies" if max_tokens == 200 else "long-replies"
        assert max_tokens == (200 if name == "short-replies" else 2000)
        tokens = _provider_count(request.json)
        # Every request and the reply it allows fit the window, as the provider counts.
        assert tokens + max_tokens <= WINDOW, (name, tokens, max_tokens)
        sent[name].append(tokens)
    assert len(sent["short-replies"]) == len(sent["long-replies"]) == 40
    # Both conversations outgrew the window; the one reserving 2000 tokens for its replies
    # was held to a prompt the other one passed.
    assert max(sent["long-replies"]) < WINDOW - 2000 < max(sent["short-replies"])
    # Same conversation, same turn, once both were compressed: the long replies' prompt is smaller.
    assert sum(sent["long-replies"][-10:]) < sum(sent["short-replies"][-10:])

    ctxd = await ctxd_client(ctxd_daemon)
    try:
        for name, reserved in (("short-replies", 200), ("long-replies", 2000)):
            info = await ctxd.request("session/get", {"sessionId": name})
            assert info["settings"] == {"outputTokens": reserved, "outputFloor": FLOOR_AT_WINDOW}
            assert info["contextWindow"] == WINDOW
            assert info["compressionCount"] >= 1
            stats = await ctxd.request("context/stats", {"sessionId": name})
            assert stats["budget"]["reservedOutput"] == reserved
    finally:
        await ctxd.close()


async def test_the_reserve_follows_the_request_and_is_updated_only_when_it_changes(proxy, upstream,
                                                                                   ctxd_daemon) -> None:
    """OpenAI's ``max_completion_tokens`` (or ``max_tokens``): the session is created with it
    and updated only when a request asks for another; a request without one leaves it."""
    limits: list[dict] = [{}, {"max_completion_tokens": 300}, {"max_completion_tokens": 300}, {"max_tokens": 1500},
                          {}, {"max_completion_tokens": 1500}, {"max_completion_tokens": 1500}]
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0) as client:
        for turn, limit in enumerate(limits):
            messages.append({"role": "user", "content": f"Change the limit, turn {turn}."})
            reply = await client.chat.completions.create(model=MODEL, messages=messages, **limit)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    sent = upstream.chats("/v1/chat/completions")
    # The client's limits reach the upstream as sent (absent where absent).
    assert [{k: r.json[k] for k in ("max_tokens", "max_completion_tokens") if k in r.json} for r in sent] == limits

    [info] = await sessions(ctxd_daemon)
    assert info["settings"] == {"outputTokens": 1500, "outputFloor": FLOOR}
    # Two changes (none -> 300 -> 1500): two updates, not one per request.
    changes = db_query(ctxd_daemon.data_dir, "SELECT detail FROM session_events WHERE session_id = ? AND kind = ? "
                                             "ORDER BY at", (info["sessionId"], "settings"))
    assert [json.loads(d) if isinstance(d, str) else d for (d,) in changes] == [
        {"settings": {"outputTokens": 300}}, {"settings": {"outputTokens": 1500}}]


async def test_ollama_num_predict_and_responses_max_output_tokens(proxy, ctxd_daemon) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
        messages: list[dict] = []
        for num_predict in (-1, 0, 640):
            messages.append({"role": "user", "content": f"Ollama's limit {num_predict}."})
            body = {"model": MODEL, "stream": False, "options": {"num_predict": num_predict}, "messages": messages}
            answer = await http.post("/api/chat", json=body)
            assert answer.status_code == 200
            messages.append(answer.json()["message"])
        body = {"model": MODEL, "max_output_tokens": 700, "store": False,
                "input": [{"role": "user", "content": "The Responses limit."}]}
        assert (await http.post("/v1/responses", json=body)).status_code == 200
    reserves = {s["sessionId"].split("-")[1]: s["settings"] for s in await sessions(ctxd_daemon)}
    # -1 and 0 are no limit (the session keeps none, then takes 640).
    assert reserves == {"ollama": {"outputTokens": 640, "outputFloor": FLOOR},
                        "responses": {"outputTokens": 700, "outputFloor": FLOOR}}
