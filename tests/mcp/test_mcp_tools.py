"""``ctxd mcp`` end to end: the SDK's client session over stdio against ``ctxd mcp`` (a
real subprocess) against a real daemon. Every tool is called, the resources are read,
bad arguments and unknown ids come back as tool errors (and the server keeps serving),
and results are paged under their token cap."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from tests.mcp.conftest import McpEnv, agent_messages, seed_session, tokens

TOOLS = {"list_sessions", "session_stats", "search_history", "read_message", "list_checkpoints",
         "expand_checkpoint", "set_goal", "lock_decision", "pin_message", "create_snapshot",
         "list_snapshots", "restore_snapshot"}
SESSION_TOOLS = TOOLS - {"list_sessions"}


async def call(session: ClientSession, name: str, args: dict[str, Any] | None = None) -> str:
    """A tool's text; the test fails when the tool reports an error."""
    result = await session.call_tool(name, args or {})
    text = "\n".join(part.text for part in result.content if part.type == "text")
    assert not result.is_error, f"{name}({args}) failed: {text}"
    return text


async def call_error(session: ClientSession, name: str, args: dict[str, Any]) -> str:
    """A tool call that must fail as a tool error (is_error), not as a crash."""
    result = await session.call_tool(name, args)
    text = "\n".join(part.text for part in result.content if part.type == "text")
    assert result.is_error, f"{name}({args}) should have failed: {text}"
    assert text.strip(), f"{name}({args}) failed without a message"
    return text


def more_hint(text: str) -> str | None:
    match = re.search(r"More: (\w+\(.*\))\.", text)
    return match.group(1) if match else None


def no_crash(env: McpEnv) -> None:
    stderr = env.stderr_text()
    assert "Traceback" not in stderr, stderr
    assert "unexpected exception" not in stderr, stderr


# --- every tool, against a real daemon --------------------------------------------------


async def test_every_tool_end_to_end(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        seeded = await seed_session(client)
        other = await seed_session(client, compress=False, topic="tokenizer", title="other")
        sid, cid = seeded["sessionId"], seeded["checkpointId"]
        async with mcp_env.session() as session:
            listed = await session.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS
            for tool in listed.tools:
                assert tool.description, tool.name
                if tool.name in SESSION_TOOLS:
                    assert "session_id" in tool.input_schema["properties"], tool.name

            text = await call(session, "list_sessions")
            assert sid in text and other["sessionId"] in text and "(end)" in text

            text = await call(session, "session_stats", {"session_id": sid})
            assert f"session {sid}" in text and "budget: window 16,384" in text
            assert f"{seeded['lastSeq']} messages" in text and "1 checkpoints" in text

            # Search one session, then all of them.
            text = await call(session, "search_history", {"query": "marker4", "session_id": sid})
            assert "#" in text and "marker4" in text and "tokenizer" not in text
            text = await call(session, "search_history", {"query": "fix done", "all_sessions": True})
            assert sid in text and other["sessionId"] in text

            # What the checkpoint stands for, from history.
            text = await call(session, "list_checkpoints", {"session_id": sid})
            assert cid in text
            text = await call(session, "expand_checkpoint", {"checkpoint_id": cid, "session_id": sid,
                                                             "max_tokens": 20000})
            assert "#1 user" in text and "Fix the urlvalidator bug" in text
            assert "file0.py:59: line 59 of step 0" in text  # a tool output, whole
            assert "(end)" in text

            # A message by sequence number, whole.
            text = await call(session, "read_message", {"seq": 3, "session_id": sid})
            assert "#3 tool" in text and "file0.py:0: line 0 of step 0" in text and "compressed" in text
            text = await call(session, "read_message", {"seq": 1, "session_id": sid, "count": 3})
            assert "#1 user" in text and "#2 assistant" in text and "#3 tool" in text
            assert "[tool call call_urlvalidator_0] bash" in text

            # Goal, decision, pin: checked through the daemon itself.
            await call(session, "set_goal", {"description": "Reject URLs with newlines", "session_id": sid,
                                             "priority": "high"})
            text = await call(session, "lock_decision", {"decision": "Validate with a compiled regex",
                                                         "session_id": sid})
            assert "(locked): Validate with a compiled regex" in text
            goal = (await client.request("goal/get", {"sessionId": sid}))["goal"]
            assert goal["description"] == "Reject URLs with newlines" and goal["priority"] == "high"
            assert goal["decisions"] == [{"description": "Validate with a compiled regex", "locked": True}]
            await call(session, "lock_decision", {"decision": "validate with a compiled regex", "unlock": True,
                                                  "session_id": sid})
            goal = (await client.request("goal/get", {"sessionId": sid}))["goal"]
            assert not goal["decisions"][0].get("locked")

            text = await call(session, "pin_message", {"seq": 2, "session_id": sid})
            assert "is pinned" in text
            assert 2 in (await client.request("context/stats", {"sessionId": sid}))["pinned"]
            await call(session, "pin_message", {"seq": 2, "pinned": False, "session_id": sid})
            assert 2 not in (await client.request("context/stats", {"sessionId": sid}))["pinned"]

            # Snapshots: take one, change the context, restore it.
            text = await call(session, "create_snapshot", {"label": "before more work", "session_id": sid})
            snap = re.search(r"snapshot_id='([^']+)', session_id='([^']+)'", text).group(1)  # type: ignore[union-attr]
            await client.request("session/push", {"sessionId": sid, "messages": [
                {"role": "user", "content": "Also handle tabs."}, {"role": "assistant", "content": "Will do."}]})
            text = await call(session, "list_snapshots", {"session_id": sid})
            assert snap in text and "'before more work'" in text
            text = await call(session, "restore_snapshot", {"snapshot_id": snap, "session_id": sid})
            assert f"Restored snapshot {snap}" in text and "rolled back" in text
            history = await client.request("session/history", {"sessionId": sid, "from": seeded["lastSeq"] + 1})
            assert {entry["status"] for entry in history["messages"]} == {"rolled_back"}
    finally:
        await client.close()
    no_crash(mcp_env)


async def test_resources(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        seeded = await seed_session(client)
        sid = seeded["sessionId"]
        await client.request("goal/set", {"sessionId": sid, "description": "Ship the fix",
                                          "decisions": [{"description": "No new dependency", "locked": True}]})
    finally:
        await client.close()
    async with mcp_env.session() as session:
        resources = await session.list_resources()
        assert [r.uri for r in resources.resources] == ["ctxd://sessions"]
        templates = await session.list_resource_templates()
        assert {t.uri_template for t in templates.resource_templates} == {
            "ctxd://sessions/{session_id}/goal", "ctxd://sessions/{session_id}/checkpoints"}

        import json

        sessions = json.loads((await session.read_resource("ctxd://sessions")).contents[0].text)
        assert [s["sessionId"] for s in sessions["sessions"]] == [sid]
        goal = json.loads((await session.read_resource(f"ctxd://sessions/{sid}/goal")).contents[0].text)
        assert goal["goal"]["description"] == "Ship the fix"
        assert goal["goal"]["decisions"][0] == {"description": "No new dependency", "locked": True}
        checkpoints = json.loads((await session.read_resource(f"ctxd://sessions/{sid}/checkpoints")).contents[0].text)
        assert [c["id"] for c in checkpoints["checkpoints"]] == [seeded["checkpointId"]]
        assert checkpoints["checkpoints"][0]["messageRanges"]

        for uri in ("ctxd://sessions/no-such-session/goal", "ctxd://sessions/no-such-session/checkpoints"):
            with pytest.raises(MCPError) as err:
                await session.read_resource(uri)
            assert "no session 'no-such-session'" in str(err.value)
        # Still serving.
        assert await session.read_resource("ctxd://sessions")
    no_crash(mcp_env)


# --- errors -------------------------------------------------------------------------------


async def test_bad_arguments_are_tool_errors(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        seeded = await seed_session(client, compress=False)
        sid = seeded["sessionId"]
    finally:
        await client.close()
    async with mcp_env.session() as session:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("read_message", {"seq": "three"}, "seq"),
            ("read_message", {"seq": 0}, "greater than or equal to 1"),
            ("read_message", {}, "seq"),
            ("read_message", {"seq": 1, "count": 1000}, "count"),
            ("read_message", {"seq": 1, "max_tokens": 5}, "max_tokens"),
            ("read_message", {"seq": 1, "char_offset": 10**7, "session_id": sid}, "past the end"),
            ("search_history", {}, "query"),
            ("search_history", {"query": "   "}, "query is empty"),
            ("search_history", {"query": "x", "role": "robot"}, "role"),
            ("search_history", {"query": "x", "session_id": sid, "all_sessions": True}, "not both"),
            ("search_history", {"query": "x", "offset": 190, "limit": 20}, "at most"),
            ("search_history", {"query": "\"unbalanced", "syntax": "fts", "session_id": sid}, "ctxd refused"),
            ("expand_checkpoint", {"checkpoint_id": ""}, "checkpoint_id"),
            ("set_goal", {"description": "x", "priority": "urgent"}, "priority"),
            ("set_goal", {"description": "  "}, "description is empty"),
            ("lock_decision", {"decision": "No ORM", "session_id": sid}, "set_goal"),  # no goal yet
            ("pin_message", {"seq": -1}, "seq"),
            ("list_sessions", {"limit": 0}, "limit"),
            ("list_snapshots", {"offset": -3}, "offset"),
        ]
        for name, args, expected in cases:
            text = await call_error(session, name, args)
            assert expected in text, (name, args, text)
        unknown = await session.call_tool("no_such_tool", {})
        assert unknown.is_error and "no_such_tool" in unknown.content[0].text
        # The server still serves after all that.
        assert sid in await call(session, "list_sessions")
    no_crash(mcp_env)


async def test_unknown_ids(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        seeded = await seed_session(client, compress=False)
        sid = seeded["sessionId"]
    finally:
        await client.close()
    per_tool: dict[str, dict[str, Any]] = {
        "session_stats": {}, "search_history": {"query": "urlvalidator"}, "read_message": {"seq": 1},
        "list_checkpoints": {}, "expand_checkpoint": {"checkpoint_id": "ckpt_x"},
        "set_goal": {"description": "x"}, "lock_decision": {"decision": "x"}, "pin_message": {"seq": 1},
        "create_snapshot": {}, "list_snapshots": {}, "restore_snapshot": {"snapshot_id": "snap_x"},
    }
    assert set(per_tool) == SESSION_TOOLS
    async with mcp_env.session() as session:
        for name, args in per_tool.items():
            text = await call_error(session, name, {**args, "session_id": "no-such-session"})
            assert "no session 'no-such-session'" in text and "list_sessions" in text, (name, text)
        # Unknown things inside an existing session.
        text = await call_error(session, "read_message", {"seq": 999, "session_id": sid})
        assert f"no message #999 in session {sid}" in text and f"#1-#{seeded['lastSeq']}" in text
        text = await call_error(session, "pin_message", {"seq": 999, "session_id": sid})
        assert "#999" in text
        text = await call_error(session, "expand_checkpoint", {"checkpoint_id": "ckpt_x", "session_id": sid})
        assert "checkpoint 'ckpt_x'" in text
        text = await call_error(session, "restore_snapshot", {"snapshot_id": "snap_x", "session_id": sid})
        assert "snapshot 'snap_x'" in text
    # A launcher's CTXD_SESSION that names no session says so.
    async with mcp_env.session(CTXD_SESSION="gone") as session:
        text = await call_error(session, "session_stats", {})
        assert "no session 'gone' (from CTXD_SESSION)" in text
    no_crash(mcp_env)


async def test_autostart_and_no_sessions(mcp_env: McpEnv) -> None:
    """No daemon runs: the first tool call starts one (like ctxd-cli); with no session
    yet, a tool says so instead of failing obscurely."""
    assert mcp_env.daemon_pid() is None
    async with mcp_env.session() as session:
        text = await call_error(session, "session_stats", {})
        assert "no sessions yet" in text
        assert mcp_env.daemon_pid() is not None
        assert "(no sessions)" in await call(session, "list_sessions")
        client = await mcp_env.client()
        try:
            seeded = await seed_session(client, compress=False)
        finally:
            await client.close()
        assert f"session {seeded['sessionId']} (most recently active)" in await call(session, "session_stats")
    no_crash(mcp_env)


# --- which session -------------------------------------------------------------------------


async def test_default_session_rule(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        a = (await seed_session(client, compress=False, topic="alpha", title="A"))["sessionId"]
        b = (await seed_session(client, compress=False, topic="beta", title="B"))["sessionId"]
        async with mcp_env.session() as session:
            # B was active last.
            assert f"session {b} (most recently active)" in await call(session, "session_stats")
            await client.request("session/push", {"sessionId": a, "messages": [{"role": "user", "content": "more"}]})
            assert f"session {a} (most recently active)" in await call(session, "session_stats")
            text = await call(session, "search_history", {"query": "beta"})
            assert "(no hits)" in text  # searched A, the most recent
            # An explicit id wins.
            assert f"session {b}" in await call(session, "session_stats", {"session_id": b})
        async with mcp_env.session(CTXD_SESSION=b) as session:
            text = await call(session, "session_stats")
            assert f"session {b} (CTXD_SESSION)" in text
            text = await call(session, "search_history", {"query": "beta"})
            assert "marker" in text or "beta" in text
            assert f"session {a}" in await call(session, "session_stats", {"session_id": a})
        async with mcp_env.session("--session", a, CTXD_SESSION=b) as session:
            assert f"session {a} (CTXD_SESSION)" in await call(session, "session_stats")
    finally:
        await client.close()
    no_crash(mcp_env)


# --- paging and the token cap ---------------------------------------------------------------


async def test_paging_and_token_cap(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        seeded = await seed_session(client, turns=24)
        sid, cid = seeded["sessionId"], seeded["checkpointId"]
        checkpoint = (await client.request("checkpoint/expand", {"sessionId": sid, "checkpointId": cid}))
        want = [m["seq"] for m in checkpoint["messages"]]
        huge = "\n".join(f"row {n}: " + "lorem ipsum dolor sit amet " * 3 for n in range(1500))
        pushed = await client.request("session/push", {"sessionId": sid, "messages": [
            {"role": "assistant", "content": "Reading the log.", "toolCalls": [
                {"id": "big", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
            {"role": "tool", "toolCallId": "big", "content": huge}]})
        big_seq = pushed["messageCount"]
    finally:
        await client.close()
    async with mcp_env.session() as session:
        # Expand page by page under a small cap: every page fits, together they are the checkpoint.
        cap, seen, args, pages = 600, [], {"checkpoint_id": cid, "session_id": sid, "max_tokens": 600}, 0
        while True:
            text = await call(session, "expand_checkpoint", args)
            pages += 1
            assert tokens(text) <= cap, (tokens(text), text[-300:])
            seen += [int(n) for n in re.findall(r"^--- #(\d+) ", text, re.M)]
            hint = more_hint(text)
            if hint is None:
                assert "(end)" in text
                break
            offset = int(re.search(r"offset=(\d+)", hint).group(1))  # type: ignore[union-attr]
            assert hint.startswith("expand_checkpoint(") and offset == len(seen)
            args = {**args, "offset": offset}
        assert pages > 2 and seen == want

        # A message larger than the cap: cut, and the hints read the rest exactly.
        pieces, args = [], {"seq": big_seq, "session_id": sid, "max_tokens": 1500}
        for _ in range(100):
            text = await call(session, "read_message", args)
            assert tokens(text) <= 1500
            body = text.split("\n", 3)[3]  # after the header, a blank line and the message's head line
            body = body.split("\n[... cut at the token cap]")[0]
            cut = re.search(r"the rest: read_message\(seq=(\d+), char_offset=(\d+), session_id='([^']+)'\)", text)
            if cut is None:
                pieces.append(body.rsplit("\n\n[messages", 1)[0])
                break
            assert int(cut.group(1)) == big_seq and cut.group(3) == sid
            offset = int(cut.group(2))
            pieces.append(body)
            args = {**args, "char_offset": offset}
        assert len(pieces) > 3
        assert "".join(pieces) == f"[tool result big]\n{huge}"

        # Search pages: limit, offset, and the hint to go on.
        first = await call(session, "search_history", {"query": "urlvalidator", "session_id": sid, "limit": 3})
        assert len(re.findall(r"^--- #", first, re.M)) == 3
        assert f"session_id={sid!r}, offset=3, limit=3" in (more_hint(first) or "")
        second = await call(session, "search_history", {"query": "urlvalidator", "session_id": sid, "limit": 3,
                                                        "offset": 3})
        firsts = set(re.findall(r"^--- #(\d+)", first, re.M))
        assert firsts.isdisjoint(re.findall(r"^--- #(\d+)", second, re.M))
        assert "[hits 4-6]" in second

        # The whole session's reading at the default cap stays under it.
        text = await call(session, "read_message", {"seq": 1, "session_id": sid, "count": 50})
        assert tokens(text) <= 4000 and more_hint(text) is not None
    # The server's own default cap (--max-tokens).
    async with mcp_env.session("--max-tokens", "300") as session:
        text = await call(session, "read_message", {"seq": big_seq, "session_id": sid})
        assert tokens(text) <= 300 and "cut at the token cap" in text
        text = await call(session, "session_stats", {"session_id": sid})
        assert tokens(text) <= 300
    no_crash(mcp_env)


async def test_stdout_carries_only_frames_with_verbose_logs(mcp_env: McpEnv) -> None:
    """With -vv every log line goes to stderr; the session still works (a stray line on
    stdout would break the client's frame parsing)."""
    client = await mcp_env.client()
    try:
        sid = (await seed_session(client, compress=False))["sessionId"]
    finally:
        await client.close()
    async with mcp_env.session("-vv") as session:
        assert sid in await call(session, "list_sessions")
        await call_error(session, "read_message", {"seq": 999})
    assert "ctxd" in mcp_env.stderr_text()
    no_crash(mcp_env)


def test_agent_messages_shape() -> None:
    messages = agent_messages(3)
    assert messages[0]["role"] == "user" and messages[-1]["role"] == "assistant"


async def test_reconnects_after_the_daemon_stops(mcp_env: McpEnv) -> None:
    """The daemon goes away under a running ``ctxd mcp``: the next call starts one again
    and reads the same data."""
    client = await mcp_env.client()
    try:
        sid = (await seed_session(client, compress=False))["sessionId"]
    finally:
        await client.close()
    async with mcp_env.session() as session:
        assert sid in await call(session, "list_sessions")
        first = mcp_env.daemon_pid()
        client = await mcp_env.client()
        try:
            await client.request("daemon/stop", timeout=10)
        finally:
            await client.close(shutdown=False)
        for _ in range(200):  # until the old daemon is gone (no timing assertion: just wait)
            if mcp_env.daemon_pid() != first:
                break
            await asyncio.sleep(0.05)
        assert sid in await call(session, "list_sessions")
        assert mcp_env.daemon_pid() not in (None, first)
    no_crash(mcp_env)
