"""Bad arguments come back as one line an agent reads at once: the argument, what it
should be and what was given, not pydantic's multi-line report with its URL."""

from __future__ import annotations

import asyncio
import time

from tests.mcp.conftest import McpEnv, seed_session
from tests.mcp.test_mcp_tools import call, call_error, no_crash


async def test_bad_arguments_read_plainly(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        sid = (await seed_session(client, compress=False))["sessionId"]
    finally:
        await client.close()
    cases = [
        ("read_message", {"seq": 0}, "read_message: bad arguments: seq should be greater than or equal to 1 (given 0)"),
        ("read_message", {"seq": "three"}, "seq should be a valid integer, unable to parse string as an integer "
                                           "(given 'three')"),
        ("read_message", {}, "read_message: bad arguments: seq is required"),
        ("read_message", {"seq": 1, "max_tokens": 5, "count": 0},
         "count should be greater than or equal to 1 (given 0); max_tokens should be greater than or equal to 200 "
         "(given 5)"),
        ("set_goal", {"description": "x", "priority": "urgent"},
         "priority should be 'high', 'medium' or 'low' (given 'urgent')"),
    ]
    async with mcp_env.session() as session:
        for name, args, expected in cases:
            text = await call_error(session, name, args)
            assert expected in text, (name, args, text)
            assert "pydantic" not in text and "validation error for" not in text and "\n" not in text.strip(), text
        assert sid in await call(session, "list_sessions")
    no_crash(mcp_env)


async def test_a_20_mb_goal_is_refused_fast_and_nothing_waits_for_it(mcp_env: McpEnv) -> None:
    """issue 23, 6: a 20 MB goal took 28.6 s, stalled a concurrent request past 15 s and
    left the session failing on "the newest user message". Now the tool refuses it at
    once, saying the size; another request is answered meanwhile; the session is intact."""
    client = await mcp_env.client()
    try:
        sid = (await seed_session(client, compress=False))["sessionId"]
        async with mcp_env.session() as session:
            started = time.monotonic()
            stats = asyncio.ensure_future(client.request("context/stats", {"sessionId": sid}, timeout=30))
            text = await call_error(session, "set_goal", {"description": "g" * 20_000_000, "session_id": sid})
            took = time.monotonic() - started
            await stats
            assert "description string should have at most 4000 characters" in text, text[:500]
            assert "(20,000,000 characters)" in text and len(text) < 1000
            assert took < 10, took
            assert "Goal set" in await call(session, "set_goal", {"description": "ship the fix", "session_id": sid})
        pushed = await client.request("session/push", {"sessionId": sid, "messages": [
            {"role": "user", "content": "and now?"}, {"role": "assistant", "content": "done"}]})
        assert pushed["messageCount"] > 2
        prompt = await client.request("context/prompt", {"sessionId": sid})
        assert "ship the fix" in prompt["messages"][0]["content"]
    finally:
        await client.close()
    no_crash(mcp_env)
