"""Request sequences shaped as real agents send them, through ``ctxd proxy``: one session
per conversation, nothing stored twice, the client's newest context intact upstream.

* aider (aider/coders/base_coder.py ``format_chat_chunks``, chat_chunks.py): every
  request is rebuilt as system, repository map pair, the done messages, the files in the
  chat as a user/assistant pair (the file's current text), the current message, and a
  trailing system reminder; the files pair moves after the done messages each turn and
  changes when the file is edited.
* Claude Code: its copy of an Edit call carries ``"replace_all": false``, which the
  model's ``tool_use`` did not; long tool definitions.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import history, sessions
from tests.proxy.upstream import MODEL

REMINDER = "Reminder: reply with SEARCH/REPLACE blocks for every change. " * 3


def _source(turn: int) -> str:
    """src/app.py as aider's chat shows it after ``turn`` edits: it grows."""
    return "".join(f"def handler_{n}(request):\n    return render(request, 'page_{n}.html')\n\n"
                   for n in range(30 + 6 * turn))


def _aider_request(turn: int, done: list[dict[str, Any]], cur: str, *, changing_map: bool = False
                   ) -> list[dict[str, Any]]:
    """``changing_map``: the repository map (the first user message) lists the handler
    added last, as aider's does once the code changed."""
    newest = f"  def handler_{30 + 6 * turn}(request)\n" if changing_map else ""
    return [
        {"role": "system", "content": "Act as an expert software developer. Use SEARCH/REPLACE blocks."},
        {"role": "user", "content": "Here are summaries of some files present in my git repository:\n"
                                    f"src/app.py:\n  def handler_0(request)\n{newest}src/util.py:\n  def helper()"},
        {"role": "assistant", "content": "Ok, I won't try and edit those files without asking first."},
        *done,
        {"role": "user", "content": f"I have *added these files to the chat*:\n\nsrc/app.py\n```\n{_source(turn)}```"},
        {"role": "assistant", "content": "Ok, any changes I propose will be to those files."},
        {"role": "user", "content": cur},
        {"role": "system", "content": REMINDER},
    ]


@pytest.mark.parametrize("changing_map", [False, True])
async def test_aider_one_session_its_files_intact_nothing_piled_up(proxy, upstream, ctxd_daemon,
                                                                   changing_map: bool) -> None:
    window = 8_000
    upstream.count_all = True
    upstream.padding = " The change adds a handler and its template, and keeps the others." * 40
    done: list[dict[str, Any]] = []
    turns = 14
    async with httpx.AsyncClient(base_url=proxy.url, timeout=60) as client:
        for turn in range(turns):
            cur = f"Turn {turn}: add handler_{30 + 6 * turn} to src/app.py and explain the change in detail."
            messages = _aider_request(turn, done, cur, changing_map=changing_map)
            body = {"model": MODEL, "messages": messages, "max_tokens": 1000, "stream": turn % 2 == 1}
            reply = await client.post("/v1/chat/completions", content=json.dumps(body).encode(),
                                      headers={"authorization": "Bearer sk-aider", "user-agent": "aider/0.86",
                                               "x-ctxd-context-window": str(window)})
            assert reply.status_code == 200, reply.text
            if body["stream"]:
                text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                               for line in reply.text.splitlines()
                               if line.startswith("data: {") and json.loads(line[6:])["choices"])
            else:
                text = reply.json()["choices"][0]["message"]["content"]
            done += [{"role": "user", "content": cur}, {"role": "assistant", "content": text}]
    infos = await sessions(ctxd_daemon)
    assert len(infos) == 1, [s["sessionId"] for s in infos]  # one conversation, no fork
    stored = await history(ctxd_daemon, infos[0]["sessionId"])
    # Stored: the repo map pair, the files' acknowledgement and the reminder once, each
    # turn's files copy (the file changed every turn), each request and reply once (and
    # each turn's repository map when it changed).
    assert len(stored) == 4 + turns * (4 if changing_map else 3) - (1 if changing_map else 0), len(stored)
    sent = upstream.chats()
    assert len(sent) == turns
    for turn, request in enumerate(sent):
        out = request.json["messages"]
        # The newest files message and the newest request reach the upstream intact, in
        # the client's order, the reminder last.
        files = f"I have *added these files to the chat*:\n\nsrc/app.py\n```\n{_source(turn)}```"
        contents = [m.get("content") for m in out]
        assert files in contents, f"turn {turn}: the file is not in the request"
        assert contents.count(files) == 1 and not any(f"```\n{_source(turn - 1)}```" == c for c in contents[:-3])
        assert contents[-2].startswith(f"Turn {turn}:") and contents[-1] == REMINDER
        # The files, their acknowledgement (stored once, on the first turn: kept verbatim as
        # the client's current context), the request, the reminder.
        assert contents.index(files) == len(contents) - 4
        assert contents[-3] == "Ok, any changes I propose will be to those files."
        # The upstream's order is the client's: each request before its reply.
        asked = [c for c in contents if c.startswith("Turn ")]
        assert asked == sorted(asked, key=lambda c: int(c.split()[1].rstrip(":")))
        assert upstream.input_tokens(request.json) <= window, (turn, upstream.input_tokens(request.json))
    # Over the window by the end as the client sends it: ctxd compressed the older turns.
    assert upstream.input_tokens({"messages": _aider_request(turns - 1, done, "x")}) > window


async def test_claude_code_edit_copies_stay_in_their_session(proxy, upstream, ctxd_daemon) -> None:
    """The model's tool_use comes back from the client with ``"replace_all": false`` added
    (and a cache breakpoint): the same message, no fork, and the upstream gets the
    client's copy of it, byte for byte."""
    messages: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=proxy.url, timeout=60) as client:
        for turn in range(4):
            messages.append({"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Today is Monday.</system-reminder>"},
                {"type": "text", "text": f"Edit step {turn}: please use the tool."}]})
            body = {"model": MODEL, "max_tokens": 8000, "system": "You are Claude Code.", "messages": messages}
            reply = await client.post("/v1/messages", content=json.dumps(body).encode(),
                                      headers={"x-api-key": "sk-ant-cc", "anthropic-version": "2023-06-01",
                                               "user-agent": "claude-cli/2.1.3 (external, cli)"})
            assert reply.status_code == 200, reply.text
            content = reply.json()["content"]
            call = next(b for b in content if b["type"] == "tool_use")
            # Claude Code's copy: the optional field written out, a breakpoint on it.
            copy = [dict(b, input=dict(b["input"], replace_all=False)) if b["type"] == "tool_use" else b
                    for b in content]
            messages.append({"role": "assistant", "content": copy})
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                          "content": f"edited step {turn}"}]})
            body["messages"] = messages
            reply = await client.post("/v1/messages", content=json.dumps(body).encode(),
                                      headers={"x-api-key": "sk-ant-cc", "anthropic-version": "2023-06-01"})
            assert reply.status_code == 200, reply.text
            messages.append({"role": "assistant", "content": reply.json()["content"]})
    infos = await sessions(ctxd_daemon)
    assert len(infos) == 1, [s["sessionId"] for s in infos]
    assert len(await history(ctxd_daemon, infos[0]["sessionId"])) == len(messages)
    last = upstream.chats()[-1].json["messages"]
    copies = [m for m in last if m["role"] == "assistant" and any(b.get("type") == "tool_use" for b in m["content"])]
    assert len(copies) == 4
    assert all(b["input"].get("replace_all") is False for m in copies for b in m["content"] if b["type"] == "tool_use")


async def test_codex_keeps_its_prefix_in_shape_and_place(proxy, upstream, ctxd_daemon) -> None:
    """Codex's shape on the Responses API: ``instructions``, a leading developer item, two
    leading user items (AGENTS.md, the environment), then the task and tool exchanges.
    Compressed at a small window, the upstream still gets the instructions and the three
    leading items as sent and in their place, ctxd's checkpoint after them as a developer
    item, the two user items never joined."""
    window = 6_000
    upstream.padding = " The build is fine and the tests pass." * 30
    developer = {"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": "<permissions>sandbox: workspace-write</permissions>"}]}
    agents = {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "# AGENTS.md instructions\n\nRun the tests with make."}]}
    environment = {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "<environment_context>cwd: /repo</environment_context>"}]}
    items: list[dict[str, Any]] = [developer, agents, environment]
    async with httpx.AsyncClient(base_url=proxy.url, timeout=60) as client:
        for turn in range(12):
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": f"Task {turn}: please use the tool."}]})
            for _ in range(2):
                body = {"model": MODEL, "instructions": "You are Codex.", "input": items, "store": False,
                        "max_output_tokens": 1000}
                reply = await client.post("/v1/responses", content=json.dumps(body).encode(),
                                          headers={"authorization": "Bearer sk-codex",
                                                   "user-agent": "codex_cli_rs/0.171.0",
                                                   "x-ctxd-context-window": str(window)})
                assert reply.status_code == 200, reply.text
                output = reply.json()["output"]
                items += output
                calls = [o for o in output if o["type"] == "function_call"]
                if not calls:
                    break
                items += [{"type": "function_call_output", "call_id": c["call_id"],
                           "output": "ok " * 300} for c in calls]
    [info] = await sessions(ctxd_daemon)
    assert info["compressionCount"] >= 1
    for request in upstream.chats("/v1/responses"):
        sent = request.json
        assert sent["instructions"] == "You are Codex."
        assert sent["input"][:1] == [developer]
        rest = sent["input"][1:]
        if rest and rest[0].get("role") == "developer":  # ctxd's checkpoint, after the client's prefix
            rest = rest[1:]
        assert rest[:2] == [agents, environment]


async def test_codex_freeform_calls_kept_as_sent(proxy, upstream, ctxd_daemon) -> None:
    """Codex's ``apply_patch`` is a freeform tool: ``custom_tool_call`` items and their
    ``custom_tool_call_output``. Stored as ctxd's typed freeform call and a tool result
    (never a placeholder, never under ``assistant``); upstream, where ctxd writes an item
    itself (an output it cleared to fit the window), it is of the same type and keeps the
    client's item id, so every request pairs each output with a call of its kind."""
    window = 6_000
    upstream.padding = " The patch applies cleanly and the tests pass." * 30
    tools = [{"type": "custom", "name": "apply_patch", "description": "edit files"}]
    items: list[dict[str, Any]] = [{"type": "message", "role": "developer",
                                    "content": [{"type": "input_text", "text": "<permissions>on</permissions>"}]}]
    async with httpx.AsyncClient(base_url=proxy.url, timeout=60) as client:
        for turn in range(10):
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": f"Change {turn}: use the patch tool."}]})
            for _ in range(2):
                body = {"model": MODEL, "instructions": "You are Codex.", "input": items, "store": False,
                        "tools": tools, "max_output_tokens": 1000, "stream": turn % 2 == 1}
                reply = await client.post("/v1/responses", content=json.dumps(body).encode(),
                                          headers={"authorization": "Bearer sk-codex",
                                                   "user-agent": "codex_cli_rs/0.171.0",
                                                   "x-ctxd-context-window": str(window)})
                assert reply.status_code == 200, reply.text
                if body["stream"]:
                    [done] = [json.loads(line[6:]) for line in reply.text.splitlines()
                              if line.startswith("data: ") and '"response.completed"' in line]
                    output = done["response"]["output"]
                else:
                    output = reply.json()["output"]
                items += output
                calls = [o for o in output if o["type"] == "custom_tool_call"]
                if not calls:
                    break
                size = 3000 if turn == 6 else 600  # (turn 6's: too big for the window, sent as an excerpt)
                items += [{"type": "custom_tool_call_output", "id": f"ctco_{c['call_id']}", "call_id": c["call_id"],
                           "output": f"Success. Updated the following files:\nM src/app.py\n{'ok ' * size}"}
                          for c in calls]
    [info] = await sessions(ctxd_daemon)
    assert info["compressionCount"] >= 1
    stored = await history(ctxd_daemon, info["sessionId"])
    assert not any("not kept by ctxd" in json.dumps(m) for m in stored)
    freeform = [m for m in stored if any(c.get("type") == "custom" for c in m.get("toolCalls") or ())]
    assert len(freeform) == 10 and all(m["role"] == "assistant" for m in freeform)
    assert freeform[0]["toolCalls"][0]["custom"]["input"].startswith("*** Begin Patch")
    answered = {c["id"] for m in freeform for c in m["toolCalls"]}
    assert {m["toolCallId"] for m in stored if m["role"] == "tool"} == answered
    client_ids = {(i["type"], i["call_id"]): i["id"] for i in items if "call_id" in i and "id" in i}
    rewritten = 0
    for request in upstream.chats("/v1/responses"):
        for item in request.json["input"]:
            if "call_id" not in item:
                continue
            assert item["type"] in ("custom_tool_call", "custom_tool_call_output"), item
            assert item.get("id") == client_ids[item["type"], item["call_id"]]  # the client's id, kept
            if item["type"] == "custom_tool_call_output" and "ok " * 600 not in item["output"]:
                rewritten += 1  # an output ctxd cleared or cut: still the client's item, of its type
    assert rewritten > 0
