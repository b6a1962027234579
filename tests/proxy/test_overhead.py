"""What the provider counts beside the messages (an agent's tool definitions: Claude Code
sends ~20k tokens of them) is learned once per client and model and carried into the
sessions that client starts: a fork, a new conversation, a restarted proxy. No upstream
request goes over the window as the provider counts it."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.proxy.conftest import sessions
from tests.proxy.upstream import MODEL

WINDOW = 24_000
REPLY = 4_000
# Tool definitions of ~9k tokens as the upstream counts them (a quarter of their JSON):
# over a third of the window, like Claude Code's at a 48k window.
TOOLS = [{"name": f"tool_{n}", "description": f"Tool {n}. " + "Use it to inspect the repository files. " * 90,
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}} for n in range(10)]
TOOLS.append({"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}})
SYSTEM = "You are a coding agent. " * 40
OUTPUT = "src/app.py:{n}: def handler_{n}(request): return render(request, 'page_{n}.html')\n"
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01",
           "user-agent": "claude-cli/2.1.3 (external, cli)",
           "x-ctxd-context-window": str(WINDOW)}


async def _turns(client: httpx.AsyncClient, messages: list[dict], count: int, start: int) -> None:
    """``count`` agent turns: the user asks, the model calls a tool, its long result goes back."""
    for n in range(start, start + count):
        messages.append({"role": "user", "content": f"Step {n}: please use the tool on file {n}."})
        for _ in range(2):
            body = {"model": MODEL, "max_tokens": REPLY, "system": SYSTEM, "tools": TOOLS, "messages": messages}
            reply = await client.post("/v1/messages", content=json.dumps(body).encode(), headers=HEADERS)
            assert reply.status_code == 200, reply.text
            content = reply.json()["content"]
            messages.append({"role": "assistant", "content": content})
            call = next((b for b in content if b["type"] == "tool_use"), None)
            if call is None:
                break
            result = "".join(OUTPUT.format(n=k) for k in range(40 * n, 40 * n + 40))
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                          "content": result}]})


def _over(upstream: Any, start: int = 0) -> list[int]:
    return [n for n in (upstream.input_tokens(r.json) for r in upstream.chats()[start:]) if n > WINDOW]


async def test_a_fork_and_a_new_conversation_start_with_what_was_learned(start_proxy, upstream,
                                                                         ctxd_daemon) -> None:
    upstream.count_all = True
    proxy = start_proxy()
    async with httpx.AsyncClient(base_url=proxy.url, timeout=60) as client:
        messages: list[dict] = []
        await _turns(client, messages, 14, 0)
        # The conversation reached the window: sent whole it would leave no room for the
        # reply (the proxy left part of it out), and the fullest request came within one
        # tool result (~1k tokens) of that room (~19.5k with the margin). Where below it
        # the fullest lands depends on where the passes left the conversation, not on the
        # overhead this test is about.
        whole = {"system": SYSTEM, "tools": TOOLS, "messages": messages}
        assert upstream.input_tokens(whole) > WINDOW - REPLY
        assert max(upstream.input_tokens(r.json) for r in upstream.chats()) > WINDOW * 0.75
        # The agent rewrites an early reply: the conversation forks, the fork starts with
        # the whole history, and knows the tools' weight from its first request on.
        reply = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        messages[reply] = {"role": "assistant", "content": [{"type": "text", "text": "A rewritten answer."}]}
        messages[reply + 1:reply + 2] = []  # (and its tool call's result goes with the call)
        forked_at = len(upstream.chats())
        await _turns(client, messages, 3, 14)
        infos = [s["sessionId"] for s in await sessions(ctxd_daemon)]
        assert len(infos) == 2 and any(sid.endswith("~2") for sid in infos)
        assert _over(upstream, forked_at) == []
        # A restarted proxy, a new conversation of the same client and model, already long
        # (a resumed agent session): the first request fits too.
        proxy.stop()
        restarted = start_proxy()
        resumed = [dict(m) for m in messages]
        resumed[0] = {"role": "user", "content": "Another conversation, resumed."}
        at = len(upstream.chats())
        async with httpx.AsyncClient(base_url=restarted.url, timeout=60) as again:
            await _turns(again, resumed, 2, 17)
        assert len(await sessions(ctxd_daemon)) == 3
        assert _over(upstream, at) == []
    assert _over(upstream) == []
