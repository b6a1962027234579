"""Bad arguments come back as one line an agent reads at once: the argument, what it
should be and what was given, not pydantic's multi-line report with its URL."""

from __future__ import annotations

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
