"""The reply's reserve lent to the newest turn (``proxy.reply_floor_tokens``,
``settings.outputFloor``): an agent's newest tool output a little too big for the room its
``max_tokens`` leaves goes upstream whole, with ``max_tokens`` lowered to what the window
leaves, never below the floor; the upstream refuses input + ``max_tokens`` over the window,
as Anthropic does, so every request it answered is one a provider accepts."""

from __future__ import annotations

import httpx
import pytest

from tests.proxy.conftest import ctxd_client
from tests.proxy.upstream import MODEL

WINDOW = 8192
ASKED = 2000
FLOOR = 1024


def _rows(n: int) -> str:
    return "\n".join(f"{k}: SKU-{k:05d},widget {k},{k * 31 % 997},{k % 17}" for k in range(n))


async def _agent(proxy_url: str, rows: int) -> tuple[list[httpx.Response], list[dict]]:
    """Six short turns, then a tool call whose result is ``rows`` rows long."""
    messages: list[dict] = []
    answers = []
    headers = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01", "X-Ctxd-Context-Window": str(WINDOW)}
    async with httpx.AsyncClient(base_url=proxy_url, headers=headers, timeout=60) as http:
        async def ask() -> dict:
            answer = await http.post("/v1/messages", json={"model": MODEL, "max_tokens": ASKED,
                                                           "system": "You are a careful agent.",
                                                           "messages": messages})
            answers.append(answer)
            assert answer.status_code == 200, answer.text
            reply = answer.json()
            messages.append({"role": "assistant", "content": reply["content"]})
            return reply
        for turn in range(6):
            messages.append({"role": "user", "content": f"Turn {turn}: " + "check the parser again. " * 40})
            await ask()
        messages.append({"role": "user", "content": "Now use the tool to read data/items.csv."})
        reply = await ask()
        call = next(b for b in reply["content"] if b["type"] == "tool_use")
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                      "content": _rows(rows)}]})
        await ask()
    return answers, messages


@pytest.mark.parametrize("rows,whole", [(300, True), (600, False)])
async def test_a_newest_tool_output_borrows_from_the_reply_and_max_tokens_is_lowered(
        start_proxy, upstream, ctxd_daemon, rows: int, whole: bool) -> None:
    upstream.count_all = True
    upstream.window = WINDOW
    proxy = start_proxy("--set", f"proxy.reply_floor_tokens={FLOOR}")
    answers, messages = await _agent(proxy.url, rows)
    assert not upstream.refused, upstream.refused
    last = upstream.chats("/v1/messages")[-1].json
    result = last["messages"][-1]["content"][0]["content"]
    text = result if isinstance(result, str) else "".join(b.get("text", "") for b in result)
    asked = last["max_tokens"]
    if whole:
        assert text == _rows(rows)
        assert FLOOR <= asked < ASKED
        assert answers[-1].headers["x-ctxd-reply-limit"] == f"{asked}; asked={ASKED}"
        assert upstream.input_tokens(last) + asked <= WINDOW
    else:  # too big even at the floor: an excerpt, the reply keeps its reserve
        assert "left out by ctxd" in text and asked == ASKED
        assert "x-ctxd-reply-limit" not in answers[-1].headers
    client = await ctxd_client(ctxd_daemon)
    try:
        [info] = (await client.request("session/list", {}))["sessions"]
        assert info["settings"]["outputFloor"] == FLOOR
    finally:
        await client.close()


async def test_a_small_windows_floor_is_an_eighth_of_it(start_proxy, upstream, ctxd_daemon) -> None:
    """At 16K the client's 8,000 is already reserved as a quarter of the window (4,000): the
    default 4,096 floor would lend nothing, so the floor there is an eighth of the window."""
    proxy = start_proxy()
    headers = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01", "X-Ctxd-Context-Window": "16000"}
    async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=60) as http:
        answer = await http.post("/v1/messages", json={"model": MODEL, "max_tokens": 8000,
                                                       "messages": [{"role": "user", "content": "Hello."}]})
        assert answer.status_code == 200, answer.text
    client = await ctxd_client(ctxd_daemon)
    try:
        [info] = (await client.request("session/list", {}))["sessions"]
        assert info["settings"]["outputFloor"] == 2000
    finally:
        await client.close()
