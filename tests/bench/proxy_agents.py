"""Agents as they are, through ``ctxd proxy``: request sequences shaped as aider and
Claude Code send them (tests/proxy/test_agents_shaped.py), against the fake upstream
counting what a provider counts (system, tools, messages).

    python -m tests.bench.proxy_agents [--turns 14] [--out bench-results/proxy_agents.json]

Per sequence: sessions the conversation ended up in (forks and new ids), messages
stored, the largest upstream request against the window, and the share of requests in
which the client's newest message (and for aider its files in the chat) reached the
upstream intact. To measure another tree (before/after), point ``PYTHONPATH`` at its
checkout: the daemon and the proxy are subprocesses and import ctxd from there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.bench.spine import machine
from tests.e2e.helpers import Daemon, short_dir
from tests.proxy.conftest import ProxyProcess, ctxd_client
from tests.proxy.test_agents_shaped import REMINDER, _aider_request, _source
from tests.proxy.upstream import MODEL, FakeUpstream

TOOLS = [{"name": f"tool_{n}", "description": f"Tool {n}. " + "Use it to inspect the repository files. " * 90,
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}} for n in range(10)]


async def _aider(client: httpx.AsyncClient, turns: int, window: int, changing_map: bool) -> None:
    done: list[dict[str, Any]] = []
    for turn in range(turns):
        cur = f"Turn {turn}: add handler_{30 + 6 * turn} to src/app.py and explain the change in detail."
        body = {"model": MODEL, "messages": _aider_request(turn, done, cur, changing_map=changing_map),
                "max_tokens": 1000}
        reply = await client.post("/v1/chat/completions", content=json.dumps(body).encode(),
                                  headers={"authorization": "Bearer sk-aider", "user-agent": "aider/0.86",
                                           "x-ctxd-context-window": str(window)})
        reply.raise_for_status()
        done += [{"role": "user", "content": cur}, reply.json()["choices"][0]["message"]]


def _aider_intact(received: list[Any]) -> list[bool]:
    out = []
    for turn, request in enumerate(received):
        contents = [m.get("content") for m in request.json["messages"]]
        files = f"I have *added these files to the chat*:\n\nsrc/app.py\n```\n{_source(turn)}```"
        out.append(files in contents and any(isinstance(c, str) and c.startswith(f"Turn {turn}:") for c in contents)
                   and contents[-1] == REMINDER)
    return out


async def _claude_code(client: httpx.AsyncClient, turns: int, window: int) -> None:
    messages: list[dict[str, Any]] = []
    headers = {"x-api-key": "sk-ant-cc", "anthropic-version": "2023-06-01",
               "user-agent": "claude-cli/2.1.3 (external, cli)", "x-ctxd-context-window": str(window)}
    for turn in range(turns):
        messages.append({"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>Today is Monday.</system-reminder>"},
            {"type": "text", "text": f"Edit step {turn}: please use the tool."}]})
        for _ in range(2):
            body = {"model": MODEL, "max_tokens": 8000, "system": "You are Claude Code.", "tools": TOOLS,
                    "messages": messages}
            reply = await client.post("/v1/messages", content=json.dumps(body).encode(), headers=headers)
            reply.raise_for_status()
            content = reply.json()["content"]
            call = next((b for b in content if b["type"] == "tool_use"), None)
            messages.append({"role": "assistant", "content": [
                dict(b, input=dict(b["input"], replace_all=False)) if b["type"] == "tool_use" else b
                for b in content]})
            if call is None:
                break
            result = "".join(f"src/app.py:{k}: def handler_{k}(request): return render(request)\n"
                             for k in range(40 * turn, 40 * turn + 40))
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                          "content": result}]})


def _claude_intact(received: list[Any]) -> list[bool]:
    out = []
    for request in received:
        last = request.json["messages"][-1]
        out.append(isinstance(last.get("content"), list) and bool(last["content"]))
    return out


async def _one(name: str, turns: int, window: int) -> dict[str, Any]:
    base = short_dir("ctxd-agents-")
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    with FakeUpstream() as upstream:
        upstream.count_all = True
        upstream.padding = " The change adds a handler and its template, and keeps the others." * 40
        daemon.start()
        proxy = ProxyProcess(daemon.socket_path, upstream, base / "proxy.log", []).start()  # type: ignore[arg-type]
        try:
            async with httpx.AsyncClient(base_url=proxy.url, timeout=120) as client:
                if name.startswith("aider"):
                    await _aider(client, turns, window, changing_map=name == "aider (map changes)")
                else:
                    await _claude_code(client, turns, window)
            await asyncio.sleep(0.5)  # (the last reply's push)
            ctxd = await ctxd_client(daemon)
            try:
                listed = (await ctxd.request("session/list", {}))["sessions"]
            finally:
                await ctxd.close()
            received = upstream.chats()
            sizes = [upstream.input_tokens(r.json) for r in received]
            intact = _aider_intact(received) if name.startswith("aider") else _claude_intact(received)
            return {"sequence": name, "window": window, "requests": len(received), "sessions": len(listed),
                    "stored": sum(s["messageCount"] for s in listed),
                    "client_messages": len(received[-1].json["messages"]) if received else 0,
                    "max_request": max(sizes, default=0), "over_window": sum(n > window for n in sizes),
                    "intact": sum(intact) / len(intact) if intact else 0.0}
        finally:
            proxy.stop()
            daemon.stop()
            shutil.rmtree(base, ignore_errors=True)


async def run(turns: int) -> list[dict[str, Any]]:
    return [await _one("aider", turns, 8000), await _one("aider (map changes)", turns, 8000),
            await _one("claude code (Edit copies)", turns, 24000)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.proxy_agents", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=14)
    parser.add_argument("--out", default="bench-results/proxy_agents.json")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.turns))
    print("| sequence | requests | sessions | stored | last request's messages | max request / window | "
          "over the window | newest intact |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sequence']} | {r['requests']} | {r['sessions']} | {r['stored']} | {r['client_messages']} | "
              f"{r['max_request']} / {r['window']} | {r['over_window']} | {r['intact']:.0%} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": machine(), "results": rows}, indent=2) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
