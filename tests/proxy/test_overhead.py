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


# An agent's side conversation and its task, as opencode holds them: a title asked of the
# same model with no tools, then the task with ~4.6k tokens of tools and ~2.5k of system.
SMALL_WINDOW = 16_000
AGENT_TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name}: " + "Reads, writes or runs what the agent asks for in the repository. " * 34,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    for name in ("get_weather", "read", "write", "edit", "bash", "glob", "grep", "list", "todo")]
AGENT_SYSTEM = "You are a coding agent working in the user's repository. " * 200
LINE = "    {n:4d}  def handler_{n}(request): return render(request, 'templates/page_{n}.html', context)\n"


async def test_a_side_conversation_without_tools_teaches_the_task_nothing(upstream, tmp_path) -> None:
    """What a title request (no tools) taught is not carried into the task's session (tools):
    a line fitted through both read the tools' thousands of tokens as a doubled ratio, which
    halved the prompt's room (the newest read went as an excerpt though it fits beside the
    reply's floor) and underestimated a smaller prompt (prompt + max_tokens over the window).
    In process: the proxy's app on the daemon's service port, a provider that counts
    everything it is sent and refuses prompt + max_tokens over the window."""
    from ctxd.config import load_config
    from ctxd.embed import open_here
    from ctxd.proxy import wire as proxy_wire
    from ctxd.proxy.app import Proxy, build_app
    from ctxd.proxy.inproc import PortLink
    from ctxd.proxy.sessions import Sessions
    from ctxd.proxy.windows import Windows
    from tests.agents import measure

    upstream.count_all = True
    upstream.window = SMALL_WINDOW
    config = load_config(None, overrides={"daemon": {"data_dir": str(tmp_path / "data"),
                                                     "socket": str(tmp_path / "run" / "ctxd.sock")},
                                          "proxy": {"openai_base_url": upstream.url + "/v1"}})
    headers = {"authorization": "Bearer sk-test", "user-agent": "opencode/1.18.0 ai-sdk/provider-utils",
               "x-ctxd-context-window": str(SMALL_WINDOW), "content-type": "application/json"}
    link = PortLink(await open_here(config))
    sessions = Sessions(link, reply_floor=config.proxy.reply_floor_tokens)
    task = "Please fix the failing test in the repository."
    try:
        async with proxy_wire.UpstreamTransport(limits=httpx.Limits()) as transport:
            app = build_app(Proxy(config.proxy, sessions, transport, httpx.Timeout(30), Windows.from_config(config)))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                         timeout=60) as http:
                async def ask(body: dict[str, Any]) -> dict[str, Any]:
                    answer = await http.post("/v1/chat/completions", content=json.dumps(body).encode(),
                                             headers=headers)
                    assert answer.status_code == 200, answer.text
                    await sessions.drain()  # (the reply's usage learned before the next request)
                    return answer.json()["choices"][0]["message"]

                await ask({"model": MODEL, "max_tokens": 8000, "messages": [
                    {"role": "system", "content": "You are a title generator. Output only a title."},
                    {"role": "user", "content": f"Generate a title for this conversation: {task}"}]})
                messages: list[dict[str, Any]] = [{"role": "system", "content": AGENT_SYSTEM},
                                                  {"role": "user", "content": task}]
                for step, lines in enumerate((5, 25, 40, 200)):
                    messages.append({"role": "user", "content": f"Step {step}: please use the tool on a file."})
                    call = await ask({"model": MODEL, "max_tokens": 8000, "tools": AGENT_TOOLS,
                                      "messages": messages})
                    messages.append(call)
                    result = "".join(LINE.format(n=n) for n in range(lines))
                    messages.append({"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": result})
                    messages.append(await ask({"model": MODEL, "max_tokens": 8000, "tools": AGENT_TOOLS,
                                               "messages": messages}))
    finally:
        await link.close()
    assert upstream.refused == []  # (prompt + max_tokens within the window: the provider refuses more)
    last = next(r.json for r in reversed(upstream.chats()) if r.json["messages"][-1]["role"] == "tool")
    client = dict(last, messages=messages[:-1])
    # The read fits beside the fixed part and the reply's floor, as the provider counts them...
    assert not measure.cannot_fit("chat", client, SMALL_WINDOW, [])
    assert upstream.input_tokens(client) > SMALL_WINDOW - 8000  # (...but not beside the client's max_tokens)
    # ...and reaches the upstream whole.
    assert last["messages"][-1] == messages[-2]


async def test_the_profiles_learned_are_bounded_the_least_recently_used_forgotten() -> None:
    """A client whose tools change makes a new profile each time, for as long as the proxy
    runs: at most ``Sessions.PROFILES`` are kept, the least recently used forgotten (a
    session started for one then learns again from the sessions of that profile)."""
    from types import SimpleNamespace

    from ctxd.proxy.sessions import Sessions

    class Link:
        async def request(self, session_id: str, method: str, params: Any) -> Any:
            return {"sessions": []}  # (nothing stored to learn from)

    proxy_sessions = Sessions(Link())  # type: ignore[arg-type]
    proxy_sessions.PROFILES = 3

    def learn(profile: str) -> None:
        conv = SimpleNamespace(profile=profile, prompt_tokens=1_000, prompt_window=WINDOW)
        proxy_sessions._learn(conv, {"inputTokens": 1_300})  # type: ignore[arg-type]

    for n in range(4):
        learn(f"anthropic|claude-cli|{MODEL}|tools-{n}")
    assert list(proxy_sessions._learned) == [f"anthropic|claude-cli|{MODEL}|tools-{n}" for n in (1, 2, 3)]
    assert await proxy_sessions._samples(f"anthropic|claude-cli|{MODEL}|tools-1")  # (used: kept longest now)
    learn(f"anthropic|claude-cli|{MODEL}|tools-4")
    assert list(proxy_sessions._learned) == [f"anthropic|claude-cli|{MODEL}|tools-{n}" for n in (3, 1, 4)]
    for n in range(10):
        await proxy_sessions._samples(f"openai|aider|{MODEL}|tools-{n}")
    assert len(proxy_sessions._looked_up) <= 3
