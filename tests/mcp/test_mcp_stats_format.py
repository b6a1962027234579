"""``session_stats(format=...)``: the prompt's figures in one provider's shape, as
``context/stats`` with that ``format`` gives them. With signed thinking in the
conversation the shapes differ: OpenAI and Ollama send no thinking, Anthropic sends the
signed blocks (tests/unit/test_one_count.py shows the same of ``context/stats``).
Another value is refused, saying which argument, what it takes and what was given."""

from __future__ import annotations

import re
from typing import Any

from tests.mcp.conftest import McpEnv
from tests.mcp.test_mcp_tools import call, call_error, no_crash

SID = "thinking"
THOUGHT = "The parser fails on nested brackets; the tokenizer splits them too early. " * 6


def conversation() -> list[dict[str, Any]]:
    """A question, an answer carrying signed thinking (and an unsigned block, which no
    shape sends), and the user's next turn."""
    return [
        {"role": "user", "content": "Why does the parser fail?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": "sig-1"},
            {"type": "thinking", "thinking": "Other provider's reasoning."},
            {"type": "text", "text": "Nested brackets."}]},
        {"role": "user", "content": "Fix it."},
    ]


def prompt_now(text: str) -> tuple[str | None, int, int]:
    """The ``prompt now`` line: its format (None: the context's own count), its tokens, and
    the budget's ``free``."""
    line = re.search(r"^prompt now(?: \((\w+) format\))?: ([\d,]+) tokens", text, re.M)
    free = re.search(r", free ([\d,]+)$", text, re.M)
    assert line and free, text
    return line.group(1), int(line.group(2).replace(",", "")), int(free.group(1).replace(",", ""))


async def test_session_stats_counts_the_prompt_of_a_format(mcp_env: McpEnv) -> None:
    client = await mcp_env.client()
    try:
        await client.request("session/create", {"sessionId": SID, "model": "claude-sonnet-4-5",
                                                 "contextWindow": 200_000})
        await client.request("session/push", {"sessionId": SID, "messages": conversation()})
        expected: dict[str | None, dict[str, Any]] = {}
        for fmt in (None, "openai", "ollama", "anthropic"):
            params = {"sessionId": SID} if fmt is None else {"sessionId": SID, "format": fmt}
            expected[fmt] = await client.request("context/stats", params)
        async with mcp_env.session() as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            schema = tools["session_stats"].input_schema["properties"]["format"]
            assert "openai" in str(schema) and "anthropic" in str(schema) and "ollama" in str(schema), schema
            assert "thinking" in str(schema), schema  # the description says what differs

            got: dict[str | None, tuple[str | None, int, int]] = {}
            for fmt in (None, "openai", "ollama", "anthropic"):
                args = {"session_id": SID} if fmt is None else {"session_id": SID, "format": fmt}
                got[fmt] = prompt_now(await call(session, "session_stats", args))
                stats = expected[fmt]
                assert got[fmt] == (fmt, stats["contextTokens"], stats["budget"]["free"]), (fmt, got[fmt])
            # OpenAI and Ollama send no thinking; Anthropic sends the signed block; the
            # context's own count holds it too (and fits any shape).
            assert got["openai"][1] == got["ollama"][1] < got["anthropic"][1] <= got[None][1], got
            assert got["anthropic"][1] - got["openai"][1] >= len(THOUGHT) // 8, got

            text = await call_error(session, "session_stats", {"session_id": SID, "format": "gemini"})
            assert "session_stats: bad arguments: format should be 'openai', 'anthropic' or 'ollama' " \
                   "(given 'gemini')" in text, text
            # Still serving.
            assert prompt_now(await call(session, "session_stats", {"session_id": SID}))[0] is None
    finally:
        await client.close()
    no_crash(mcp_env)
