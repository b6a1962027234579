"""Which session a tool means when it is named the way people see it: ``ctxd-cli
sessions list`` shows ids ctxd made up as their shortest unique prefix (``3f2c1a9b``),
and that is what a user copies into ``CTXD_SESSION`` or an agent is told. ``ctxd mcp``
takes those short forms (and ``last``) like ``ctxd-cli`` does; results name the whole
id. Also: a cut message's footer counts the message's characters, as ``char_offset``
does."""

from __future__ import annotations

import asyncio
import re

from tests.mcp.conftest import McpEnv, seed_session
from tests.mcp.test_mcp_tools import call, call_error, no_crash


async def test_a_short_id_names_its_session(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        sid = (await seed_session(client, compress=False, title="seeded"))["sessionId"]
        big = "\n".join(f"row {n}: " + "lorem ipsum dolor sit amet " * 3 for n in range(400))
        pushed = await client.request("session/push", {"sessionId": sid, "messages": [
            {"role": "user", "content": big}]})
        big_seq = pushed["messageCount"]
        for name in ("proj-alpha", "proj-beta"):
            await client.request("session/create", {"sessionId": name, "title": name})
            await client.request("session/push", {"sessionId": name, "messages": [
                {"role": "user", "content": f"hello from {name}"}]})
            await asyncio.sleep(0.01)  # (activity is stamped to the millisecond: beta is the later)
    finally:
        await client.close()
    short = sid[:8]  # what `ctxd-cli sessions list` shows
    async with mcp_env.session(CTXD_SESSION=short) as session:
        text = await call(session, "session_stats")
        assert f"session {sid} (CTXD_SESSION, from {short!r})" in text, text
        # Hints to read on carry the whole id.
        text = await call(session, "read_message", {"seq": big_seq, "max_tokens": 300})
        assert f"session_id={sid!r}" in text and f"session_id={short!r}" not in text, text
        # Given by the agent: the same.
        text = await call(session, "list_snapshots", {"session_id": short})
        assert f"Snapshots of session {sid} (from {short!r})" in text, text
        assert "proj-beta" in await call(session, "session_stats", {"session_id": "proj-b"})
        # "last" as ctxd-cli takes it: the most recently active session.
        assert "session proj-beta (most recently active)" in await call(session, "session_stats",
                                                                        {"session_id": "last"})
        # A prefix of several is an error that names them; of none, as before.
        text = await call_error(session, "session_stats", {"session_id": "proj-"})
        assert "'proj-' is the start of 2 session ids (proj-alpha, proj-beta)" in text, text
        text = await call_error(session, "session_stats", {"session_id": "zzz"})
        assert "no session 'zzz'" in text, text
        # Resources take them too.
        goal = await session.read_resource(f"ctxd://sessions/{short}/goal")
        assert sid in goal.contents[0].text  # type: ignore[union-attr]
    no_crash(mcp_env)


async def test_a_cut_message_counts_its_own_characters(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        sid = (await seed_session(client, compress=False))["sessionId"]
        body = "\n".join(f"line {n}: " + "words and more words " * 4 for n in range(300))
        seq = (await client.request("session/push", {"sessionId": sid, "messages": [
            {"role": "user", "content": body}]}))["messageCount"]
    finally:
        await client.close()
    async with mcp_env.session() as session:
        offset = 0
        for _ in range(3):
            text = await call(session, "read_message", {"seq": seq, "session_id": sid, "max_tokens": 400,
                                                        "char_offset": offset})
            note = re.search(r"cut after ([\d,]+) of ([\d,]+) characters; the rest: "
                             r"read_message\(seq=\d+, char_offset=(\d+)", text)
            assert note is not None, text
            shown, total, next_offset = (int(g.replace(",", "")) for g in note.groups())
            assert total == len(body) and shown == next_offset > offset, (shown, total, next_offset, offset)
            offset = next_offset
        # list_sessions: "1 message", not "1 messages".
        client = await mcp_env.client()
        try:
            await client.request("session/create", {"sessionId": "one", "title": "one"})
            await client.request("session/push", {"sessionId": "one", "messages": [{"role": "user", "content": "hi"}]})
        finally:
            await client.close()
        text = await call(session, "list_sessions")
        assert re.search(r"- one 'one' · 1 message, ", text), text
    no_crash(mcp_env)


async def test_no_autostart_does_not_promise_a_start(mcp_env: McpEnv) -> None:
    """With --no-autostart and no daemon, the error says how to get one, not that the next
    call starts it."""
    async with mcp_env.session("--no-autostart") as session:
        text = await call_error(session, "list_sessions", {})
        assert "unreachable" in text and "starting it if needed" not in text, text
        assert "never starts one" in text and "ctxd-cli daemon start" in text, text
    assert mcp_env.daemon_pid() is None
    no_crash(mcp_env)
